"""Integrity: is each line a record at all, and do its ids and counts hold together?"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import polars as pl

from audit.checks.base import RecordRule, Rule, empty_findings, findings_frame
from audit.records.batch import Batch
from audit.records.contract import COUNT_MISMATCH, FINISH_TYPES, OUT_OF_VOCABULARY, in_vocabulary
from audit.records.image_view import batch_images
from audit.records.images import expanded_counts
from audit.records.line_reading import CONTRACT, UNREADABLE


class UnreadableLine(Rule):
    """A line that cannot be read as JSON: bad syntax, not UTF-8, cut short, too long, or a key given twice.

    What it checks:
        Every non-blank line of the file parses as one JSON value for a strict parser (no
        NaN, Infinity, byte order mark or lone surrogate), with no object holding a key twice:
        polars keeps the first value and json/orjson the last, so such a line has no single
        reading; and no deeper than 253 levels of arrays and objects, beyond which orjson,
        which reads up to 1,023, cannot write the record again. A line over 64 MiB is not
        read at all: it is skipped to its newline and reported with its size. The reader
        reports the line and the reason; the rest of the file is still audited.

    Why it matters:
        A line nobody can read is a sample silently missing from training, and often the
        trace of a crash: a generator killed mid-write leaves a truncated last line, and one
        killed with space preallocated leaves gigabytes of zero bytes with no newline.

    Example:
        {"id": "glaive-7", "input_ids": [163587, 1234, 16
        {"id": "glaive-8", "output_ids": [1, 2], ..., "output_ids": [1, 2, 3]}

    Fix:
        Serialise each record from a dict (a key cannot repeat there) with a standard JSON
        writer, and write it with one `write()` of a complete line and flush it; on resume,
        drop a partial last line before appending. If the file is still being written,
        audit it again when the generator has finished.
    """

    code = "INT001"
    name = "unreadable-line"
    problem = UNREADABLE

    def check(self, batch: Batch) -> pl.DataFrame:
        # The reader finds these lines before records exist (audit.records.reader.parse_block); the
        # engine reports them under the rule whose `problem` they are.
        return empty_findings()


class ContractRule(RecordRule):
    """A rule whose predicate is a check of the pandera record contract, named by its `problem`."""

    def find(self, batch: Batch) -> pl.DataFrame:
        if batch.contract_failures.is_empty():
            return empty_findings()  # nearly every block: the contract found nothing to name
        return super().find(batch)

    def violation(self, batch: Batch) -> pl.Expr:
        failures = batch.contract_failures
        rows = failures.filter(pl.col("problem") == self.problem)["row"]
        return pl.int_range(pl.len(), dtype=pl.UInt32).is_in(rows.implode())


class RecordContract(ContractRule):
    """A record that breaks the input contract: a field missing, of the wrong type, or empty.

    What it checks:
        `input_ids` (or its alias `prompt_ids`) and `output_ids` are present lists of token
        ids (integers from 0 to 2**32 - 1: no null, negative, fraction, boolean or string),
        the prompt is not empty, the `id` is a string or an integer, `text`, `messages`,
        `tools` and `meta_info` have SGLang's JSON types, and `image_data` is a list of strings:
        every field SGLang writes in `meta_info` has its own (counts are integers from 0,
        `finish_reason.matched` a token id or a stop string, `e2e_latency` a non-negative
        number...; the table is in the input contract's page), and `cached_tokens` is no more
        than `prompt_tokens`. A field SGLang does not write is kept and ignored. Lines that are
        JSON but of the wrong shape are reported here with the field that is wrong (and for a
        bad id, its index).

    Why it matters:
        A record without its prompt or output ids cannot become a training sequence; a
        string where ids belong means a later step rewrote the record.

    Example:
        {"id": "glaive-9", "input_ids": [163587, 101], "output_ids": "The weather is..."}
        "meta_info": {"finish_reason": {"type": "stop", "matched": -1}, "cached_tokens": [0]}

    Fix:
        Save the `input_ids` you sent and the `output_ids` SGLang's `/generate` returned,
        untouched; never the text.
    """

    code = "INT002"
    name = "record-contract"
    problem = CONTRACT  # also the lines the reader refuses for their shape or types

    def message(self, batch: Batch) -> pl.Expr:
        return (
            pl.when(pl.col("input_ids").is_null())
            .then(pl.lit("input_ids is missing (also looked for prompt_ids)"))
            .when(pl.col("input_ids").list.len() == 0)
            .then(pl.lit("input_ids is empty: there is no prompt"))
            .when(~pl.col("finish_type").is_in(FINISH_TYPES).fill_null(True))
            .then(
                pl.format(
                    "meta_info.finish_reason.type is '{}', not one SGLang writes ({})",
                    pl.col("finish_type"),
                    pl.lit(", ".join(FINISH_TYPES)),
                )
            )
            .otherwise(pl.lit("output_ids is missing"))
        )


class TokenOutOfVocabulary(ContractRule):
    """A token id that the tokenizer in use does not have.

    What it checks:
        Every id in `input_ids` and `output_ids`, and the stop id SGLang reports as
        `meta_info.finish_reason.matched`, is one the tokenizer can decode: below the
        vocabulary size and not in a hole of the id space. (A value that is no token id at
        all, e.g. negative or null, is INT002's.)

    Why it matters:
        Ids outside the vocabulary were not produced by this model with this tokenizer:
        the data came from another tokenizer, or was damaged. The drafter's embedding
        lookup would fail or, worse, silently read the wrong row.

    Example:
        output_ids = [..., 1234, 999999, 163586] with a 163840-entry vocabulary.
        finish_reason = {"type": "stop", "matched": 200001} with the same vocabulary.

    Fix:
        Audit with the tokenizer the server used (compare `audit check` fingerprints), and
        regenerate records whose ids were damaged.
    """

    code = "INT003"
    name = "token-out-of-vocabulary"
    problem = OUT_OF_VOCABULARY

    def _first_bad(self, batch: Batch, column: str) -> pl.Expr:
        in_vocab = in_vocabulary(batch.tokenizer)
        return pl.col(column).list.eval(pl.arg_where(~in_vocab).first()).list.first()

    def position(self, batch: Batch) -> pl.Expr:
        return self._first_bad(batch, "output_ids")

    def message(self, batch: Batch) -> pl.Expr:
        size = batch.tokenizer.vocab_size

        def describe(column: str) -> pl.Expr:
            at = self._first_bad(batch, column)
            return pl.format(
                "{}[{}] = {} is not in the tokenizer's vocabulary ({} ids)",
                pl.lit(column),
                at,
                pl.col(column).list.get(at.cast(pl.Int64), null_on_oob=True),
                pl.lit(size),
            )

        return (
            pl.when(self._first_bad(batch, "output_ids").is_not_null())
            .then(describe("output_ids"))
            .when(self._first_bad(batch, "input_ids").is_not_null())
            .then(describe("input_ids"))
            .otherwise(
                pl.format(
                    "meta_info.finish_reason.matched = {} is not in the tokenizer's vocabulary ({} ids)",
                    pl.col("finish_matched_id"),
                    pl.lit(size),
                )
            )
        )


class MetaCountMismatch(ContractRule):
    """`meta_info` token counts that differ from the saved id lists.

    What it checks:
        `meta_info.prompt_tokens == len(input_ids)` and
        `meta_info.completion_tokens == len(output_ids)` when the counts are present. A record
        that sends images (`image_data`) was counted by the server with each image placeholder
        expanded: its `prompt_tokens` must be `len(input_ids)` plus, for each image, its
        tokens (`grid_h * grid_w / merge_size**2` after the image processor's resize, from
        the tokenizer folder's `preprocessor_config.json`) less its one pad. SGLang's Qwen-VL
        processor may resize each image first (to multiples of 28); either count is the
        server's. A record whose images could not all be read, or whose placeholders are not
        one per image (IMG001-IMG004), is not counted here.

    Why it matters:
        The server counted the tokens it produced. A different length means the ids are not
        the ones the server produced: a parser or a later step dropped or added tokens.
        Often it is the only trace left when a whole tool-call section was cut out.

    Example:
        meta_info.completion_tokens = 412, len(output_ids) = 377

    Fix:
        Save `output_ids` exactly as `/generate` returned them, with no parser in between
        (never `/v1/chat/completions` with a reasoning or tool-call parser).
    """

    code = "INT005"
    name = "meta-count-mismatch"
    problem = COUNT_MISMATCH

    def find(self, batch: Batch) -> pl.DataFrame:
        found = super().find(batch)
        vision = batch.profile.vision
        if vision is None:
            return found
        records = [r for r in batch_images(batch) if r.sent]
        if not records:
            return found
        counts = batch.records["prompt_tokens"]
        lengths = batch.records["input_ids"].list.len()
        rows, messages = [], []
        for record in records:
            given = counts[record.row]
            if given is None or lengths[record.row] is None:
                continue
            expected = expanded_counts(record.layout, lengths[record.row], list(record.reads), vision)
            if expected is None or given in expected:
                continue
            rows.append(record.row)
            shown = " or ".join(str(n) for n in sorted(expected))
            messages.append(
                f"meta_info.prompt_tokens = {given} but the prompt expanded with its "
                f"{len(record.sent)} image(s) has {shown} ids (input_ids has {lengths[record.row]})"
            )
        if not rows:
            return found
        images = findings_frame(rows, [None] * len(rows), messages)
        return pl.concat([found, images], how="vertical").unique("row", keep="first", maintain_order=True).sort("row")

    def message(self, batch: Batch) -> pl.Expr:
        prompt_off = (
            pl.col("prompt_tokens").is_not_null()
            & (pl.col("prompt_tokens") != pl.col("input_ids").list.len())
            & (pl.col("image_data").list.len().fill_null(0) == 0)  # else counted expanded (`find`)
        )
        return pl.when(prompt_off).then(
            pl.format(
                "meta_info.prompt_tokens = {} but input_ids has {} ids",
                pl.col("prompt_tokens"),
                pl.col("input_ids").list.len(),
            )
        ).otherwise(
            pl.format(
                "meta_info.completion_tokens = {} but output_ids has {} ids",
                pl.col("completion_tokens"),
                pl.col("output_ids").list.len(),
            )
        )


class DuplicateSampleId(Rule):
    """A sample id that an earlier line of the file already used.

    What it checks:
        Every `id` appears once per file. The first line keeps it; each later line with the
        same id is flagged, naming the first.

    Why it matters:
        Duplicates are the trace of a crashed and resumed generation run that did not know
        what it had already written (resume by line count is order-unsafe). They weight some
        prompts twice, and hide the ones that were skipped.

    Example:
        line 12: {"id": "glaive-0042", ...}   line 97: {"id": "glaive-0042", ...}

    Fix:
        Resume by the set of ids already written, not by line count; keep the first copy.
    """

    code = "INT004"
    name = "duplicate-sample-id"
    file_level: ClassVar[bool] = True

    def check_file(self, identities: pl.DataFrame) -> pl.DataFrame:
        """Findings over the whole file's `line`, `id` columns: `line`, `position`, `message`.

        The ids are grouped by a 64-bit hash first (a million ids as strings take ~100 MB to
        group), and the hashes by sorting a copy of them (a hash table of a million takes ~50
        MB more, at the end of the run, when its memory is highest); only the lines whose hash
        repeats are compared by their ids, exactly."""
        present = identities["id"].is_not_null().to_numpy()
        hashes = identities["id"].hash(seed=0x5EED).to_numpy()[present]
        ordered = np.sort(hashes)
        repeats = ordered[1:][ordered[1:] == ordered[:-1]]
        del ordered
        repeated_hash = np.zeros(len(present), dtype=bool)
        repeated_hash[np.flatnonzero(present)[np.isin(hashes, repeats)]] = True
        del hashes
        repeated = identities.filter(pl.Series(repeated_hash))
        first = repeated.group_by("id").agg(pl.col("line").min().alias("first_line"))
        return (
            repeated.join(first, on="id")
            .filter(pl.col("line") != pl.col("first_line"))
            .sort("line")
            .select(
                "line",
                pl.lit(None, dtype=pl.Int64).alias("position"),
                pl.format("id {} was already used on line {}", pl.col("id"), pl.col("first_line")).alias(
                    "message"
                ),
            )
        )

    def check(self, batch: Batch) -> pl.DataFrame:
        return empty_findings()
