"""Harmony channels (gpt-oss): the message grammar of an output, and its messages.

gpt-oss has no think tokens. Its output is a series of messages, each
`[<|start|>ROLE] <|channel|>NAME [to=RECIPIENT] [<|constrain|>json] <|message|>CONTENT END`
where END is `<|end|>` (more follows), `<|call|>` (a tool call: the turn stops) or `<|return|>`
(the final answer: the turn is over). The prompt ends with `<|start|>assistant`, so the first
message of the output has no `<|start|>` of its own.

The marker ids of every record are mapped to letters and matched against the message grammar
in one vectorised regex; only the short headers are decoded, in one batch. The CHN rules, the
degenerate-output rule and the record view (`audit.records.segments`) all read `harmony_messages`.
"""

from __future__ import annotations

import re

import polars as pl

from audit.records.batch import Batch
from audit.records.expressions import truncated

LETTERS = {
    "start": "B",
    "channel": "H",
    "constrain": "K",
    "message": "M",
    "end": "N",
    "call": "L",
    "return": "R",
}
# A finished output: messages ended by <|end|>, then one ended by <|return|> or <|call|>. The
# leading B stands for the <|start|> the prompt already holds.
_FINISHED = r"^(?:BHK?MN)*BHK?M[RL]$"
# A cut output (length, abort): whole messages, then any prefix of one.
_CUT = r"^(?:BHK?MN)*(?:B(?:H(?:K?(?:M[RL]?)?)?)?)?$"
# The recipient runs to a space or to the next marker's text: gpt-oss writes
# `to=functions.x <|constrain|>json` and `to=functions.x<|constrain|>json` alike (SGLang 0.5.23
# function_call/gpt_oss_detector.py reads `to=NAME\s*<\|constrain\|>json`: the space is optional).
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\|[a-z_]+\|>|\s|$)")


def channel_letters(batch: Batch) -> pl.Expr:
    """Per record, "B" plus its harmony markers in order as letters, e.g. "BHMNBHMR"."""
    markers = batch.profile.channel_markers
    # An EOS the model stops on (gpt-oss: <|endoftext|>, beside <|return|> and <|call|> in its
    # generation_config) ends the turn as <|return|> does.
    eos = [token for token in batch.profile.eos if token not in markers.values()]
    return pl.lit("B") + (
        pl.col("output_ids")
        .list.eval(
            pl.element().replace_strict(
                [*markers.values(), *eos],
                [*(LETTERS[r] for r in markers), *(LETTERS["return"] for _ in eos)],
                default=None,
                return_dtype=pl.String,
            )
        )
        .list.drop_nulls()
        .list.join("")
    )


def grammar_ok(batch: Batch) -> pl.Series:
    """Per record: do its harmony markers follow the message grammar? (one pass per batch)"""
    return batch.shared(_match_grammar)


def _match_grammar(batch: Batch) -> pl.Series:
    letters = channel_letters(batch)
    matches = pl.when(truncated()).then(letters.str.contains(_CUT)).otherwise(letters.str.contains(_FINISHED))
    return batch.records.select(matches.alias("grammar_ok")).to_series()


def harmony_messages(batch: Batch) -> pl.DataFrame:
    """One row per complete message of every grammar-valid record, in order.

    Columns: `row`, `index` (0-based message number), `start_at` / `channel_at` / `message_at` /
    `end_at` (token indexes of its markers; `start_at` -1 for the first message, whose
    `<|start|>` is the prompt's), `terminator` ("end" / "call" / "return"), `channel`
    (the channel name), `recipient` (from `to=`, in the header or after the role), `constrained`
    (a `<|constrain|>` in the header), `content_tokens`, `end_token` (the terminator's string:
    an EOS the model stopped on counts as "return").
    """
    return batch.shared(_parse_messages)


def _parse_messages(batch: Batch) -> pl.DataFrame:
    markers = batch.profile.channel_markers
    eos = [token for token in batch.profile.eos if token not in markers.values()]
    stops = [markers["end"], markers["call"], markers["return"], *eos]

    def at(ids: list[int]) -> pl.Expr:
        return pl.col("output_ids").list.eval(pl.arg_where(pl.element().is_in(ids)))

    frame = (
        batch.records.with_row_index("row")
        .filter(pl.lit(grammar_ok(batch)) & (pl.col("output_ids").list.len() > 0))
        .select(
            "row",
            "output_ids",
            h=at([markers["channel"]]),
            m=at([markers["message"]]),
            t=at(stops),
            # The first message's <|start|> is in the prompt: -1 stands for it.
            b=pl.concat_list(pl.lit([-1], dtype=pl.List(pl.Int64)), at([markers["start"]]).cast(pl.List(pl.Int64))),
        )
    )
    # A cut record may end inside a message: keep only messages that reached their end marker.
    complete = pl.col("t").list.len()
    frame = frame.with_columns(
        pl.col("h").list.head(complete), pl.col("m").list.head(complete), pl.col("b").list.head(complete)
    ).filter(complete > 0)
    messages = frame.explode("h", "m", "t", "b").with_columns(
        pl.int_range(pl.len()).over("row").alias("index")
    )
    role_heads = messages.select(
        pl.col("output_ids").list.slice(pl.col("b") + 1, pl.col("h") - pl.col("b") - 1)
    ).to_series()
    channel_heads = messages.select(
        pl.col("output_ids").list.slice(pl.col("h") + 1, pl.col("m") - pl.col("h") - 1)
    ).to_series()
    terminator_ids = messages.select(pl.col("output_ids").list.get(pl.col("t"))).to_series().to_list()
    tokenizer = batch.tokenizer
    role_texts = tokenizer.decode_batch(role_heads.to_list())
    channel_texts = tokenizer.decode_batch(channel_heads.to_list())
    constrain = batch.profile.channel_spec.markers["constrain"]
    names, recipients, constrained = [], [], []
    for role, head in zip(role_texts, channel_texts, strict=True):
        name = head.split("<|", 1)[0].split(maxsplit=1)
        names.append(name[0] if name else "")
        found = _RECIPIENT.search(head) or _RECIPIENT.search(role)
        recipients.append(found.group(1) if found else None)
        constrained.append(constrain in head)
    kind = {markers["end"]: "end", markers["call"]: "call", markers["return"]: "return"}
    kind.update(dict.fromkeys(eos, "return"))
    strings = {markers[role]: batch.profile.channel_spec.markers[role] for role in ("end", "call", "return")}
    strings.update(zip(batch.profile.eos, batch.profile.profile.eos, strict=True))
    return messages.select(
        "row",
        "index",
        pl.col("b").cast(pl.Int64).alias("start_at"),
        pl.col("h").cast(pl.Int64).alias("channel_at"),
        pl.col("m").cast(pl.Int64).alias("message_at"),
        pl.col("t").cast(pl.Int64).alias("end_at"),
        (pl.col("t") - pl.col("m") - 1).cast(pl.Int64).alias("content_tokens"),
    ).with_columns(
        pl.Series("terminator", [kind[i] for i in terminator_ids], dtype=pl.String),
        pl.Series("end_token", [strings[i] for i in terminator_ids], dtype=pl.String),
        pl.Series("channel", names, dtype=pl.String),
        pl.Series("recipient", recipients, dtype=pl.String),
        pl.Series("constrained", constrained, dtype=pl.Boolean),
    )


# Before the first message's <|channel|> the model may write only its recipient
# (`<|start|>assistant to=functions.x<|channel|>...`: the prompt holds `<|start|>assistant`).
_FIRST_HEAD = re.compile(r"\s*(?:to=\S+\s*)?")


def text_outside_messages(batch: Batch) -> pl.DataFrame:
    """Text of grammar-valid records that belongs to no harmony message: before the first
    message's `<|channel|>` (other than a `to=RECIPIENT`), or between a message's end marker
    and the next `<|start|>`. Whitespace alone is not counted. Columns `row`, `position` (token
    index where the text starts), `text`; one row a record, the first such text."""
    schema = {"row": pl.UInt32(), "position": pl.Int64(), "text": pl.String()}
    messages = harmony_messages(batch)
    if messages.is_empty():
        return pl.DataFrame(schema=schema)
    previous_end = pl.col("end_at").shift(1).over("row")
    gaps = messages.select(
        "row",
        "index",
        pl.when(pl.col("index") == 0).then(0).otherwise(previous_end + 1).alias("from"),
        pl.when(pl.col("index") == 0).then(pl.col("channel_at")).otherwise(pl.col("start_at")).alias("to"),
    ).filter(pl.col("to") > pl.col("from"))
    if gaps.is_empty():
        return pl.DataFrame(schema=schema)
    slices = batch.records.with_row_index("row").join(gaps, on="row").select(
        pl.col("output_ids").list.slice(pl.col("from"), pl.col("to") - pl.col("from"))
    ).to_series()
    texts = batch.tokenizer.decode_batch(slices.to_list())
    found = [
        (row, start, text)
        for (row, index, start), text in zip(gaps.select("row", "index", "from").iter_rows(), texts, strict=True)
        if (not _FIRST_HEAD.fullmatch(text) if index == 0 else text.strip())
    ]
    frame = pl.DataFrame(found, schema=schema, orient="row")
    return frame.group_by("row", maintain_order=True).first()
