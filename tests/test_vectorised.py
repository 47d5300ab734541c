"""Vectorised evaluations answer exactly what the reference evaluations answered.

Response bounds, the stop tokens that end an output, the stop or tool-result marker inside it
(TRM005) and the tail loops (DEG001) are computed with numpy over one flat array of a batch's
output ids (`audit.model.tokens.flat_ids`). Each is compared here, on random outputs drawn from the profile's
marker ids and a few ordinary ids (null and empty outputs included), with the polars list
expressions they replace, written out below as the reference. The record contract's checks,
evaluated in one query, are compared with pandera's own validation of the same schema.
"""

from __future__ import annotations

from functools import cache, lru_cache
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from audit.checks import RULES
from audit.checks.degenerate import loop_periods
from audit.checks.template import differing_from_saved
from audit.model.families.profiles import load_profile
from audit.model.tokens.flat_ids import ABSENT, FlatIds, MarkerIndex, differing_sequences
from audit.model.tokens.token_text import _token_at, tokens_at
from audit.model.tokens.tokenizer_cache import StoredVocabulary
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.records.batch import AuditContext, Batch
from audit.records.contract import contract_failures, record_contract, validated_by_pandera
from audit.records.reader import RECORD_COLUMNS
from audit.records.response import BOUNDS_SCHEMA, prompt_reasoning, response_bounds, tool_entry_ids

from .conftest import DEEPSEEK_TOKENIZER, KIMI_TOKENIZER

# (profile, thinking): prompt opens <think>, the model opens it, thinking off.
PROFILES = [("kimi-k2.5", True), ("kimi-k2-thinking", True), ("kimi-k2.5", False)]


@pytest.fixture(scope="module")
def contexts() -> dict[tuple[str, bool], AuditContext]:
    tokenizer = load_tokenizer(KIMI_TOKENIZER)
    return {
        (name, thinking): AuditContext(load_profile(name).resolve(tokenizer, thinking=thinking), tokenizer)
        for name, thinking in PROFILES
    }


@cache
def _profile_context(profile: str, tokenizer_dir: str) -> AuditContext:
    tokenizer = load_tokenizer(tokenizer_dir)
    """A profile resolved against a tokenizer directory, thinking on (loaded once per test run)."""
    return AuditContext(load_profile(profile).resolve(tokenizer, thinking=True), tokenizer)


def batch_of(context: AuditContext, outputs: list[list[int] | None], finish: list[str | None]) -> Batch:
    columns = {name: [None] * len(outputs) for name in RECORD_COLUMNS}
    columns["line"] = list(range(1, len(outputs) + 1))
    columns["output_ids"] = outputs
    columns["finish_type"] = finish
    return Batch(pl.DataFrame(columns, schema=RECORD_COLUMNS), context)


def outputs_strategy(alphabet: list[int], max_size: int = 40):
    ids = st.sampled_from(alphabet)
    output = st.one_of(st.none(), st.lists(ids, max_size=max_size))
    return st.lists(output, min_size=1, max_size=12)


def alphabet_of(context: AuditContext) -> list[int]:
    return [*context.profile.marker_ids, 5, 6, 7]


# -- the polars list expressions the numpy scans replace (the reference) -----------------------


def first_in(token_ids: list[int]) -> pl.Expr:
    if not token_ids:
        return pl.lit(None, dtype=pl.Int64)
    wanted = pl.lit(pl.Series(token_ids, dtype=pl.Int64)).implode()
    return pl.col("output_ids").list.eval(pl.arg_where(pl.element().is_in(wanted)).first()).list.first().cast(pl.Int64)


def trailing_stops(stop_ids: tuple[int, ...]) -> pl.Expr:
    stops = pl.lit(pl.Series(list(stop_ids), dtype=pl.Int64)).implode()
    return (
        pl.col("output_ids").list.reverse().list.eval(pl.element().is_in(stops).cum_min())
        .list.sum().fill_null(0).cast(pl.Int64)
    )


def reference_bounds(batch: Batch) -> pl.DataFrame:
    profile = batch.profile
    length = pl.col("output_ids").list.len().cast(pl.Int64)
    end = length - trailing_stops(profile.stop_ids)
    close = first_in([profile.think_end] if profile.think_end is not None else [])
    entry = first_in(tool_entry_ids(profile))
    null = pl.lit(None, dtype=pl.Int64)
    state = pl.col("reasoning")
    if profile.think_start is not None:
        opened = first_in([profile.think_start])
        model_start = pl.when(opened.is_not_null()).then(opened + 1).when(close.is_not_null()).then(0).otherwise(null)
        own_think = pl.col("output_ids").list.first() == profile.think_start
        start = (
            pl.when(state == "prompt_opens").then(pl.lit(0, dtype=pl.Int64))
            .when(state == "model_opens").then(model_start)
            .when(state == "may_open").then(pl.when(own_think.fill_null(False)).then(1).otherwise(0).cast(pl.Int64))
            .otherwise(null)
        )
    else:
        start = null
    spec = profile.tool_calls
    closed_by_call = (close.is_null() & entry.is_not_null()) if spec is not None and spec.may_end_reasoning else pl.lit(False)
    reasoning_end = pl.when(start.is_null()).then(null).when(close.is_not_null()).then(close).when(closed_by_call).then(entry).otherwise(end)
    answer_start = (
        pl.when(start.is_null()).then(pl.lit(0, dtype=pl.Int64)).when(close.is_not_null()).then(close + 1)
        .when(closed_by_call).then(entry).otherwise(null)
    )
    return batch.records.with_columns(prompt_reasoning(profile).alias("reasoning")).select(
        "reasoning", start.alias("reasoning_start"), reasoning_end.alias("reasoning_end"), close.alias("response_at"),
        entry.alias("tool_entry"), answer_start.alias("answer_start"),
        pl.max_horizontal(end, answer_start).alias("answer_end"),
    ).cast(BOUNDS_SCHEMA)


def reference_loop_period(batch: Batch, span: int, max_period: int) -> pl.Series:
    output = pl.col("output_ids")
    stops = pl.lit(pl.Series(list(batch.profile.stop_ids), dtype=pl.Int64)).implode()
    usable = output.list.len() - output.list.last().is_in(stops).fill_null(False).cast(pl.Int64)
    periods = []
    for period in range(1, max_period + 1):
        window = output.list.slice(usable - span - period, span + period)
        periodic = (window.list.head(span) == window.list.tail(span)) & (usable >= span + period)
        periods.append(pl.when(periodic).then(pl.lit(period)))
    return batch.records.select(pl.coalesce(periods).fill_null(0)).to_series()


# -- the comparisons ---------------------------------------------------------------------------


@pytest.mark.parametrize("setup", PROFILES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_response_bounds_equal_the_list_expressions(contexts, setup, data) -> None:
    context = contexts[setup]
    outputs = data.draw(outputs_strategy(alphabet_of(context)))
    batch = batch_of(context, outputs, [None] * len(outputs))
    assert response_bounds(batch).equals(reference_bounds(batch))


@pytest.mark.parametrize("profile", ["deepseek-v3.1", "deepseek-r1"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_response_bounds_follow_each_prompts_ending(profile, data) -> None:
    """Families whose accepted prompt endings leave the output in different states (the
    generation prompt opens `<think>`, a tool result's turn is closed, R1's may open its own):
    each record's state comes from its own prompt's ending, as the list expressions read it."""
    context = _profile_context(profile, str(DEEPSEEK_TOKENIZER))
    assert len(set(context.profile.suffix_reasoning)) > 1
    outputs = data.draw(outputs_strategy(alphabet_of(context)))
    # Half of them open with the model's own `<think>` (what R1's may-open state looks at).
    opens = data.draw(st.lists(st.booleans(), min_size=len(outputs), max_size=len(outputs)))
    outputs = [[context.profile.think_start, *o] if o is not None and own else o for o, own in zip(outputs, opens, strict=True)]
    ending = st.sampled_from([list(suffix) for suffix in context.profile.prompt_suffixes])
    prompt = st.one_of(
        st.none(),
        st.lists(st.sampled_from(alphabet_of(context)), max_size=4),
        st.tuples(st.lists(st.sampled_from([5, 6, 7]), max_size=3), ending).map(lambda p: p[0] + p[1]),
    )
    prompts = data.draw(st.lists(prompt, min_size=len(outputs), max_size=len(outputs)))
    batch = batch_of(context, outputs, [None] * len(outputs))
    batch = Batch(batch.records.with_columns(pl.Series("input_ids", prompts, dtype=pl.List(pl.Int64))), context)
    assert response_bounds(batch).equals(reference_bounds(batch))
    event("states " + ",".join(sorted(set(response_bounds(batch)["reasoning"].cast(pl.String).to_list()))))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_marker_index_answers_as_the_list_expressions(contexts, data) -> None:
    context = contexts[PROFILES[0]]
    alphabet = alphabet_of(context)
    outputs = data.draw(outputs_strategy(alphabet))
    wanted = data.draw(st.lists(st.sampled_from(context.profile.marker_ids), min_size=1, max_size=3, unique=True))
    n = data.draw(st.integers(0, 3))
    since = data.draw(st.lists(st.integers(0, 45), min_size=len(outputs), max_size=len(outputs)))
    batch = batch_of(context, outputs, [None] * len(outputs))
    index = MarkerIndex(FlatIds.from_series(batch.records["output_ids"]), context.profile.marker_ids)
    ids = pl.lit(pl.Series(wanted, dtype=pl.Int64)).implode()
    expected = batch.records.select(
        first_in(wanted).fill_null(ABSENT).alias("first"),
        pl.col("output_ids").list.eval(pl.arg_where(pl.element().is_in(ids))).list.get(n, null_on_oob=True)
        .cast(pl.Int64).fill_null(ABSENT).alias("nth"),
        pl.col("output_ids").list.eval(pl.element().is_in(ids).sum()).list.first().fill_null(0).cast(pl.Int64).alias("count"),
        trailing_stops(tuple(wanted)).alias("trailing"),
        pl.col("output_ids").list.slice(pl.lit(pl.Series(since)), pl.col("output_ids").list.len())
        .list.eval(pl.element().is_in(ids).sum()).list.first().fill_null(0).cast(pl.Int64).alias("since"),
    )
    assert index.first(wanted).tolist() == expected["first"].to_list()
    assert index.nth(wanted, n).tolist() == expected["nth"].to_list()
    assert index.count(wanted).tolist() == expected["count"].to_list()
    assert index.trailing_run(wanted).tolist() == expected["trailing"].to_list()
    assert index.count(wanted, since=np.array(since)).tolist() == expected["since"].to_list()


@given(skipped=st.sets(st.integers(0, 40), max_size=5), ids=st.lists(st.integers(-3, 60), max_size=30))
def test_skipped_special_ids_are_the_stored_ones(skipped, ids) -> None:
    """The ids `skip_special_tokens` drops, as a large audit tells them apart (vectorised):
    exactly the stored ones, none when none are stored, none outside the vocabulary."""
    stored = StoredVocabulary("{}", sorted(skipped))
    assert stored.skipped(np.array(ids, dtype=np.int64)).tolist() == [i in skipped for i in ids]


@settings(max_examples=150, deadline=None)
@given(sequences=st.lists(st.lists(st.integers(0, 9), max_size=6), max_size=8), data=st.data())
def test_flat_subsets_equal_the_list_operations(sequences, data) -> None:
    """The flat ids RTR002 decodes (suspects taken, special ids dropped, a final stop id
    trimmed) are those the list operations give."""
    flat = FlatIds.from_sequences(sequences)
    keep = data.draw(st.lists(st.booleans(), min_size=len(flat.values), max_size=len(flat.values)))
    kept, flags = flat.kept(np.array(keep, dtype=bool)), iter(keep)
    assert [kept.sequence(i) for i in range(len(kept))] == [[i for i in s if next(flags)] for s in sequences]
    stops = data.draw(st.sets(st.integers(0, 9), max_size=3))
    ends = flat.ends_with(stops)
    assert ends.tolist() == [bool(s) and s[-1] in stops for s in sequences]
    trimmed = flat.without_last(ends)
    assert [trimmed.sequence(i) for i in range(len(trimmed))] == [s[:-1] if s and s[-1] in stops else s for s in sequences]
    order = data.draw(st.lists(st.integers(0, max(len(sequences) - 1, 0)), max_size=10)) if sequences else []
    taken = flat.take(np.array(order, dtype=np.int64))
    assert [taken.sequence(i) for i in range(len(taken))] == [sequences[i] for i in order]


@settings(max_examples=150, deadline=None)
@given(sequences=st.lists(st.lists(st.integers(0, 4), max_size=5), max_size=8), data=st.data())
def test_differing_sequences_are_those_the_lists_tell(sequences, data) -> None:
    """RTR001's comparison of saved ids (int64) with an encoder's (uint32): which differ."""
    again = [
        data.draw(st.one_of(st.just(s), st.lists(st.integers(0, 4), min_size=len(s), max_size=len(s)), st.lists(st.integers(0, 4), max_size=5)))
        for s in sequences
    ]
    left = FlatIds.from_sequences(sequences)
    right = FlatIds.from_sequences(again)
    right = FlatIds(right.values.astype(np.uint32), right.offsets)
    assert differing_sequences(left, right).tolist() == [a != b for a, b in zip(sequences, again, strict=True)]


@settings(max_examples=150, deadline=None)
@given(sequences=st.lists(st.lists(st.integers(0, 4), max_size=5), max_size=8), data=st.data())
def test_template_comparison_equals_the_per_row_comparison(sequences, data) -> None:
    """TPL001's one numpy comparison of saved prompts with their renderings (int32) against the
    per-row `np.array_equal` it replaced, for every row in order or some rows in any order."""
    saved = FlatIds.from_sequences(sequences)
    rows = data.draw(st.one_of(
        st.just(list(range(len(sequences)))),
        st.lists(st.integers(0, len(sequences) - 1), max_size=8) if sequences else st.just([]),
    ))
    rendered = [
        np.array(data.draw(st.one_of(
            st.just(sequences[row]),
            st.lists(st.integers(0, 4), min_size=len(sequences[row]), max_size=len(sequences[row])),
            st.lists(st.integers(0, 4), max_size=5),
        )), dtype=np.int32)
        for row in rows
    ]
    expected = []
    for row, ids in zip(rows, rendered, strict=True):
        kept = saved.values[saved.offsets[row] : saved.offsets[row + 1]]
        expected.append(not (len(kept) == len(ids) and np.array_equal(kept, ids)))
    found = differing_from_saved(saved, np.array(rows, dtype=np.int64), rendered)
    assert found.tolist() == expected


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_loop_periods_equal_the_list_expressions(contexts, data) -> None:
    context = contexts[PROFILES[0]]
    stop = context.profile.stop_ids[0]
    # Short periodic tails from a tiny alphabet, with or without a stop token after them.
    piece = st.lists(st.sampled_from([5, 6, 7]), min_size=1, max_size=4)
    output = st.builds(
        lambda head, unit, times, stop_after: head + unit * times + ([stop] if stop_after else []),
        st.lists(st.sampled_from([5, 6, 7, stop]), max_size=6), piece, st.integers(0, 12), st.booleans(),
    )
    outputs = data.draw(st.lists(st.one_of(st.none(), output), min_size=1, max_size=10))
    span = data.draw(st.integers(1, 12))
    max_period = data.draw(st.integers(1, 6))
    batch = batch_of(context, outputs, [None] * len(outputs))
    assert loop_periods(batch, span, max_period).tolist() == reference_loop_period(batch, span, max_period).to_list()


def test_loop_rule_reports_period_position_and_finish(contexts) -> None:
    context = contexts[PROFILES[0]]
    stop = context.profile.stop_ids[0]
    looping = [9, 8] + [5, 6, 7] * 30 + [stop]
    batch = batch_of(context, [looping, [5, 6] * 3, None], ["stop", "length", None])
    found = RULES["DEG001"](loop_min_tokens=64).check(batch)
    assert found.rows() == [
        (0, len(looping) - 64, "output ends in a loop: a 3-token n-gram repeated over its last 64 tokens (finish stop)")
    ]
    assert RULES["DEG001"](loop_min_tokens=2**31 - 1).check(batch).is_empty()


def test_turn_joined_points_at_a_stop_token_inside_the_output(contexts) -> None:
    context = contexts[PROFILES[0]]
    profile = context.profile
    eot = profile.end_of_turn[0]
    outputs = [[5, eot, 6, eot], [5, eot, eot], [5, 6], None, []]
    batch = batch_of(context, outputs, [None] * len(outputs))
    found = RULES["TRM005"]().check(batch)
    assert found["row"].to_list() == [0] and found["position"].to_list() == [1]
    assert np.array_equal(batch.markers.first([eot]), [1, 1, ABSENT, ABSENT, ABSENT])


# Ids around a 100-id vocabulary: inside, at its edges, beyond it; a vocabulary with holes too.
VOCABULARIES = {
    "contiguous": SimpleNamespace(vocab_size=100, contiguous=True, known_ids=frozenset(range(100))),
    "with holes": SimpleNamespace(vocab_size=100, contiguous=False, known_ids=frozenset(range(100)) - {7, 50}),
}


@pytest.mark.parametrize("vocabulary", list(VOCABULARIES))
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_contract_failures_are_those_pandera_finds(vocabulary, data) -> None:
    ids = st.one_of(st.none(), st.lists(st.sampled_from([0, 1, 7, 50, 99, 100, 5000]), max_size=6))
    count = st.one_of(st.none(), st.integers(0, 7))
    rows = data.draw(st.integers(1, 8))
    columns = {name: [None] * rows for name in RECORD_COLUMNS}
    columns["line"] = list(range(1, rows + 1))
    matched = st.one_of(st.none(), st.sampled_from([0, 7, 50, 99, 100, 5000]))
    for name, values in (("input_ids", ids), ("output_ids", ids), ("prompt_tokens", count),
                         ("completion_tokens", count), ("finish_matched_id", matched),
                         ("finish_type", st.sampled_from([None, "stop", "length", "abort", "cancelled"]))):
        columns[name] = data.draw(st.lists(values, min_size=rows, max_size=rows))
    records = pl.DataFrame(columns, schema=RECORD_COLUMNS)
    schema = record_contract(VOCABULARIES[vocabulary])
    assert contract_failures(schema, records).equals(validated_by_pandera(schema, records))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_decodable_rows_are_the_same_once_the_contract_is_worked_out(data) -> None:
    """A batch whose contract (INT002's) found nothing takes every present output as decodable
    without a second pass over its ids: the same rows as that pass finds."""
    context = _profile_context("kimi-k2.5", str(KIMI_TOKENIZER))
    size = context.tokenizer.vocab_size
    output = st.one_of(st.none(), st.lists(st.sampled_from([0, 1, size - 1, size, size + 5]), max_size=5))
    outputs = data.draw(st.lists(output, min_size=1, max_size=8))

    def batch() -> Batch:
        made = batch_of(context, outputs, ["stop"] * len(outputs))
        prompts = pl.Series("input_ids", [[1]] * len(outputs), dtype=pl.List(pl.Int64))
        return Batch(made.records.with_columns(prompts), context)

    alone, after_contract = batch(), batch()
    event("the contract found nothing" if after_contract.contract_failures.is_empty() else "the contract found some")
    assert after_contract.decodable.to_list() == alone.decodable.to_list()
    assert "contract_failures" not in alone.__dict__


def test_pandera_itself_reports_the_contract_checks() -> None:
    """The reference is live: pandera runs the expression checks and finds each kind of problem."""
    columns = {name: [None] * 3 for name in RECORD_COLUMNS}
    columns.update(line=[1, 2, 3], input_ids=[[], [1], [1]], output_ids=[[1], [100], None],
                   completion_tokens=[1, 5, 5], finish_matched_id=[None, 3, 100])
    records = pl.DataFrame(columns, schema=RECORD_COLUMNS)
    schema = record_contract(VOCABULARIES["contiguous"])
    expected = [(0, "contract", "input_ids"), (2, "contract", "output_ids"),
                (1, "out_of_vocabulary", "output_ids"), (1, "count_mismatch", "completion_tokens"),
                (2, "out_of_vocabulary", "finish_matched_id")]
    assert sorted(validated_by_pandera(schema, records).rows()) == sorted(expected)
    assert contract_failures(schema, records).rows() == validated_by_pandera(schema, records).rows()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_tokens_at_from_the_byte_table_equal_prefix_decoding(data) -> None:
    """The token holding each character of a decoded output, found from the byte table's
    lengths, is the one the tokenizer's own prefix decodes point at."""
    tokenizer = _deepseek_tokenizer()
    assert tokenizer.byte_decoder is not None  # the table path is the one under test
    ids = data.draw(st.lists(st.integers(0, 300), min_size=1, max_size=30))
    text = tokenizer.decode_batch([ids])[0]
    chars = data.draw(st.lists(st.integers(0, max(0, len(text) - 1)), min_size=1, max_size=5))
    assert tokens_at(tokenizer, ids, chars) == [_token_at(tokenizer, ids, char) for char in chars]


@lru_cache(maxsize=1)
def _deepseek_tokenizer():
    return load_tokenizer(DEEPSEEK_TOKENIZER)


@pytest.mark.parametrize("name", ["qwen3", "qwen-3.6", "deepseek-v3.1", "deepseek-v4", "glm-4.7-flash", "minimax-m3"])
def test_the_byte_table_decodes_every_id_as_the_backend_does(real_tokenizer_dirs, name) -> None:
    """The table is checked against the backend only where a ByteLevel decoder may differ from it
    (added tokens, characters outside the byte map): every other id must still agree."""
    import tokenizers

    from audit.model.tokens.fastcodec import byte_decoder_for_backend
    from tests.conftest import real_tokenizer

    directory, _ = real_tokenizer(real_tokenizer_dirs, name)
    backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    size = backend.get_vocab_size(with_added_tokens=True)
    table = byte_decoder_for_backend(backend, size)
    assert table is not None
    ids = [i for i in range(size) if backend.id_to_token(i) is not None]
    reference = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    differ = [i for i, text in zip(ids, reference, strict=True) if table.piece_bytes(i).decode("utf-8", "replace") != text]
    assert differ == []


def test_an_added_token_that_spells_byte_level_characters_decodes_as_the_backend_does() -> None:
    """An added token's content may spell ByteLevel characters (`ĠĠ`): the table must hold what
    the backend decodes it to, alone and inside a sequence, and keep the fast path."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    from audit.model.tokens.fastcodec import _byte_level_chars, byte_decoder_for_backend

    byte_chars = sorted(_byte_level_chars())
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(byte_chars)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(["ĠĠ", "<tool>", "→"])
    backend.add_special_tokens(["<|ĠendĠ|>"])
    size = backend.get_vocab_size(with_added_tokens=True)
    table = byte_decoder_for_backend(backend, size)
    assert table is not None
    for token_id in range(size):
        expected = backend.decode([token_id], skip_special_tokens=False)
        assert table.piece_bytes(token_id).decode("utf-8", "replace") == expected
    sequence = backend.encode("a  b<tool>→").ids + [backend.token_to_id("<|ĠendĠ|>")]
    joined = b"".join(table.piece_bytes(i) for i in sequence).decode("utf-8", "replace")
    assert joined == backend.decode(sequence, skip_special_tokens=False)


@given(ids=st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "", "ü-7"]), st.text(max_size=14)), max_size=60))
def test_duplicate_ids_are_the_lines_whose_id_an_earlier_line_used(ids) -> None:
    """INT004 over a whole file's ids (found by sorting their hashes): exactly the lines whose
    id an earlier line already had, each naming the first; a missing id is never a duplicate."""
    from audit.checks.integrity import DuplicateSampleId

    identities = pl.DataFrame({"line": list(range(1, len(ids) + 1)), "id": ids},
                              schema={"line": pl.UInt32(), "id": pl.String()})
    found = DuplicateSampleId().check_file(identities)
    first: dict[str, int] = {}
    expected = []
    for line, sample_id in enumerate(ids, start=1):
        if sample_id is None:
            continue
        if sample_id in first:
            expected.append((line, f"id {sample_id} was already used on line {first[sample_id]}"))
        first.setdefault(sample_id, line)
    assert found.select("line", "message").rows() == expected


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_decoded_column_built_from_bytes_holds_the_decoded_texts(data) -> None:
    """`Batch.decoded_output` is built from the byte table's bytes, not from the texts: it must
    hold exactly `decode_flat`'s texts, where the bytes are not UTF-8 (a cut multi-byte
    character, ids the tokenizer lacks) too."""
    from audit.records.batch import decoded_column

    tokenizer = _deepseek_tokenizer()
    decoder = tokenizer.byte_decoder
    assert decoder is not None
    broken = [i for i in range(decoder.lengths.size) if decoder.known[i] and not _valid_utf8(decoder.piece_bytes(i))]
    assert broken, "the mini tokenizer has pieces that are not UTF-8 alone"
    ids = st.one_of(st.integers(0, 400), st.sampled_from(broken), st.integers(-2, 10**6))
    sequences = data.draw(st.lists(st.lists(ids, max_size=12), max_size=8))
    flat = FlatIds.from_sequences(sequences)
    decoded = tokenizer.decode_flat_bytes(flat)
    assert decoded is not None  # the byte table decodes here
    texts = tokenizer.decode_flat(flat)
    assert decoded_column(tokenizer, flat, "t").to_list() == texts
    assert tokenizer.texts_of(flat, decoded) == texts
    assert texts == tokenizer._decode_by_tokenizer(flat, skip_special_tokens=False)
    # Without a byte table the column is the tokenizer's own texts, decoded once.
    no_table = SimpleNamespace(decode_flat_bytes=lambda flat: None, texts_of=tokenizer.texts_of)
    assert decoded_column(no_table, flat, "t").to_list() == texts


def test_a_small_audit_decodes_its_outputs_once_towards_the_byte_table(tmp_path, monkeypatch) -> None:
    # The byte table is built once the ids decoded without it cost about what building it does;
    # the decoded column decodes (and counts) each id once, on the tokenizer's own path too.
    from audit.records.batch import decoded_column

    monkeypatch.setenv("AUDIT_CACHE_DIR", str(tmp_path))
    tokenizer = load_tokenizer(DEEPSEEK_TOKENIZER)
    flat = FlatIds.from_sequences([[5, 6, 7], [8, 9]])
    assert tokenizer.decode_flat_bytes(FlatIds.from_sequences([])) is None  # no table yet
    decoded_column(tokenizer, flat, "t")
    assert tokenizer._plain_decoded_ids == 5


def _valid_utf8(piece: bytes | None) -> bool:
    try:
        (piece or b"").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Profiles whose tool calls the view reads from marker ids, one of each way it reads them:
# calls between call begin and end (Kimi, DeepSeek), whitespace-only gaps between markers
# (`blank_between`), the answer read whole (DSML).
CALL_VIEW_PROFILES = [("kimi-k2.5", None), ("kimi-k2-thinking", None), ("deepseek-v3.1", None),
                      ("deepseek-v3.2", "deepseek-v3.2"), ("deepseek-v4", "deepseek-v4"), ("glm-4.7", "glm-4.7-flash"),
                      ("minimax-m3", "minimax-m3"), ("qwen3.6", "qwen-3.6"), ("qwen3", "qwen3")]


def _call_seeds(profile: str, context: AuditContext) -> list[list[int]]:
    """The family's own output of one call and of two (tests/families: how its model writes them)."""
    from fixtures.family_partitions import Sample, load_spec, output_text

    spec = load_spec("kimi-k2.5" if profile.startswith("kimi") else profile)
    arguments = {"city": "Paris", "days": 2, "options": {"units": "metric"}}
    one = Sample([], None, "I should call the tool.", None, "Paris", arguments)
    two = Sample([], None, "Two calls.", None, "Paris", arguments,
                 calls=[("get_weather", arguments), ("get_time", {"zone": "CET"})])
    stop = list(context.profile.stop_ids[:1])
    return [context.tokenizer.encode_text(output_text(spec, context.profile, sample)) + stop for sample in (one, two)]


def _edit(drawn: tuple[list[int], list[tuple[str, int, int]]], markers: set[int]) -> list[int]:
    """A seed with ids dropped or put in anywhere, or put right after a tool marker ("wedge":
    text between two markers where the format writes none)."""
    ids, edits = list(drawn[0]), drawn[1]
    for kind, at, token_id in edits:
        if kind == "wedge":
            places = [i + 1 for i, token in enumerate(ids) if token in markers]
            if places:
                ids.insert(places[at % len(places)], token_id)
            continue
        at %= len(ids) + 1
        if kind == "drop" and at < len(ids):
            del ids[at]
        elif kind == "put":
            ids.insert(at, token_id)
    return ids


@pytest.mark.parametrize(("profile", "real"), CALL_VIEW_PROFILES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_tool_call_view_equals_the_list_expressions(real_tokenizer_dirs, profile, real, data) -> None:
    """The answers' markers, the calls read between them and the stray text come from the
    batch's marker index; the reference reads each answer as a list (tests/reference_call_view.py)."""
    from polars.testing import assert_frame_equal, assert_series_equal

    from audit.records.call_view import tool_call_view
    from tests.conftest import real_tokenizer
    from tests.reference_call_view import reference_view

    if real is None:
        directory = KIMI_TOKENIZER if profile.startswith("kimi") else DEEPSEEK_TOKENIZER
    else:
        directory, _ = real_tokenizer(real_tokenizer_dirs, real)
    context = _profile_context(profile, str(directory))
    if context.profile.tool_call_spec.format.unit == "text":
        pytest.skip("this tokenizer spells the markers as text")
    text_ids = context.tokenizer.encode_text(' get_weather {"city": "Paris"}\n ')
    alphabet = [*context.profile.marker_ids, *text_ids]
    # Outputs with real calls (the family's own writing of one or two calls), edited at random:
    # ids dropped, markers and text put in, so that every way of reading calls is met.
    seeds = _call_seeds(profile, context)
    edited = st.tuples(st.sampled_from(seeds), st.lists(
        st.tuples(st.sampled_from(["drop", "put", "wedge"]), st.integers(0, 200), st.sampled_from(alphabet)),
        max_size=3))
    markers = set(context.profile.tool_markers.values())
    outputs = data.draw(st.lists(st.one_of(edited.map(lambda drawn: _edit(drawn, markers)), outputs_strategy(alphabet, max_size=30).map(lambda o: o[0])),
                                 min_size=1, max_size=8))
    batch = batch_of(context, outputs, [None] * len(outputs))
    view, expected = tool_call_view(batch), reference_view(Batch(batch.records, context))
    for name in ("letters", "grammar_ok", "prefix_ok", "empty_head", "first_marker"):
        assert_series_equal(getattr(view, name), getattr(expected, name), check_names=False)
    assert_frame_equal(view.calls, expected.calls)
    assert_frame_equal(view.stray, expected.stray)
    event(f"calls {min(view.calls.height, 2)} stray {min(view.stray.height, 1)} grammar {view.grammar_ok.sum()>0}")


@pytest.mark.parametrize("profile", ["deepseek-v3.1", "kimi-k2.5", "qwen3"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_tcl004_counts_marker_strings_only_where_the_prefix_is_unexplained(real_tokenizer_dirs, profile, data) -> None:
    """TCL004 counts each marker's string only in outputs whose text holds the markers' common
    prefix more often than their marker ids: the findings are those of counting everywhere,
    on outputs where marker strings are spelled with plain pieces beside the real ids."""
    import audit.checks.marker_text as marker_text
    from tests.conftest import real_tokenizer

    if profile == "qwen3":
        directory, _ = real_tokenizer(real_tokenizer_dirs, "qwen3")
    else:
        directory = KIMI_TOKENIZER if profile.startswith("kimi") else DEEPSEEK_TOKENIZER
    context = _profile_context(profile, str(directory))
    assert context.tokenizer.byte_decoder is not None  # built: the screen applies
    batch_rule = RULES["TCL004"]()
    strings = list(context.profile.tool_call_spec.markers.values())
    prefix = marker_text._screening_prefix(batch_of(context, [[]], [None]))
    assert prefix, "these families' markers share a prefix"
    # Plain pieces that spell the prefix and the rest of each marker string, apart.
    pieces = [context.tokenizer.encode_text(prefix)] + [context.tokenizer.encode_text(s[len(prefix):]) for s in strings]
    alphabet = [*context.profile.marker_ids, *[i for piece in pieces for i in piece], 5, 6]
    spelled = st.lists(st.one_of(st.sampled_from(alphabet).map(lambda i: [i]), st.sampled_from(pieces)), max_size=14)
    outputs = data.draw(st.lists(spelled.map(lambda chunks: [i for chunk in chunks for i in chunk]), min_size=1, max_size=8))
    screened = batch_rule.check(batch_of(context, outputs, ["stop"] * len(outputs)))
    prefixes = marker_text._PREFIXES.copy()
    try:
        marker_text._PREFIXES.update((tokenizer, dict.fromkeys(found, None)) for tokenizer, found in prefixes.items())
        counted = batch_rule.check(batch_of(context, outputs, ["stop"] * len(outputs)))
    finally:
        marker_text._PREFIXES.update(prefixes)
    assert screened.equals(counted)
    event(f"findings {min(counted.height, 2)}")
