"""Training samples from records: token ids and loss masks over flat arrays, and the length policy.

A sample is a record's `input_ids` followed by its `output_ids`, unchanged, with a loss mask
of 0 over the prompt and 1 over the output, unshifted (`loss_mask[i]` says whether
`input_ids[i]` is trained, as SpecForge 0.2.0 and speculators 0.9.0 both read it). Two options
take parts of the output out of the mask, never out of the ids:

    end_of_turn=False   the trailing stop token(s) the model emitted (`records/response.stop_run`)
    reasoning=False     everything before the answer: the reasoning, the `<think>` the model
                        wrote, its `</think>` (`records/response.response_bounds`); a reasoning
                        that never closed is the whole output. Harmony (gpt-oss): every message
                        on the `analysis` channel, its header and end marker included
                        (`records/channels.harmony_messages`)

A block's samples are one flat array of ids (uint32), one of mask values (uint8) and the row
offsets (`SampleBlock`): built with numpy over the block's flat id arrays, never a Python list
per id. The length policy (`--max-length`, `--long`) works on the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from audit.model.tokens.flat_ids import FlatIds
from audit.model.trainers.trainer_rules import TrainerRules
from audit.records.batch import AuditContext, Batch
from audit.records.channels import harmony_messages
from audit.records.response import response_bounds, stop_run

LONG_POLICIES = ("keep", "drop", "truncate")


@dataclass(frozen=True)
class MaskOptions:
    """What of each output is trained (the ids are always the record's, whole)."""

    end_of_turn: bool = True
    reasoning: bool = True


@dataclass
class SampleBlock:
    """Consecutive samples: row i is `values[offsets[i]:offsets[i + 1]]` with the same slice of `mask`."""

    record_ids: pl.Series  # String, null where the record has no id
    lines: np.ndarray  # uint32: the record's line in the source file
    values: np.ndarray  # uint32: input ids, all rows, flat
    mask: np.ndarray  # uint8: 1 where the id is trained
    offsets: np.ndarray  # int64, rows + 1
    # Per row, the conversation speculators sends to vLLM for a row with images (an empty list
    # for the others; `audit.flows.export_images`); None when the export writes no messages.
    messages: pl.Series | None = None

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def trained(self, window: int | None = None) -> np.ndarray:
        """Trained tokens per row (within the first `window` tokens of each, when given)."""
        running = np.zeros(len(self.mask) + 1, dtype=np.int64)
        np.cumsum(self.mask, out=running[1:])
        ends = self.offsets[1:] if window is None else np.minimum(self.offsets[:-1] + window, self.offsets[1:])
        return running[ends] - running[self.offsets[:-1]]

    def take(self, rows: np.ndarray) -> SampleBlock:
        """Rows `rows` (indices, ascending), in order."""
        starts, ends = self.offsets[:-1][rows], self.offsets[1:][rows]
        keep = _ranges(len(self.values), starts, ends)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        messages = None if self.messages is None else self.messages.gather(rows)
        return SampleBlock(
            self.record_ids.gather(rows), self.lines[rows], self.values[keep], self.mask[keep], offsets, messages
        )

    def head(self, rows: int) -> SampleBlock:
        return self.take(np.arange(min(rows, self.rows)))

    def tail(self, start: int) -> SampleBlock:
        return self.take(np.arange(start, self.rows))

    def truncated(self, max_length: int) -> SampleBlock:
        """Every row cut to its first `max_length` tokens."""
        lengths = np.minimum(self.lengths, max_length)
        keep = _ranges(len(self.values), self.offsets[:-1], self.offsets[:-1] + lengths)
        offsets = np.zeros(self.rows + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return SampleBlock(self.record_ids, self.lines, self.values[keep], self.mask[keep], offsets, self.messages)

    def frame(self) -> pl.DataFrame:
        """The rows as a polars frame: id, line, input_ids (List(UInt32)), loss_mask (List(UInt8)),
        and messages when the block has them."""
        return pl.DataFrame(
            [
                self.record_ids.alias("id"),
                pl.Series("line", self.lines, dtype=pl.UInt32),
                list_series("input_ids", self.values, self.offsets),
                list_series("loss_mask", self.mask, self.offsets),
                *([] if self.messages is None else [self.messages.alias("messages")]),
            ]
        )


SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "line": pl.UInt32(),
    "input_ids": pl.List(pl.UInt32()),
    "loss_mask": pl.List(pl.UInt8()),
}


def list_series(name: str, values: np.ndarray, offsets: np.ndarray) -> pl.Series:
    """A flat numpy array cut at `offsets` as a polars list column, handed over whole (Arrow
    buffers through nanoarrow), as `audit.records.id_lists` hands the reader's id lists."""
    import nanoarrow

    item = nanoarrow.uint32() if values.dtype == np.uint32 else nanoarrow.uint8()
    child = nanoarrow.c_array_from_buffers(item, len(values), [None, values])
    lists = nanoarrow.c_array_from_buffers(
        nanoarrow.large_list(item), len(offsets) - 1, [None, offsets.astype(np.int64, copy=False)], children=[child]
    )
    return pl.Series(lists).alias(name)


def _ranges(total: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per position in [0, total): does it fall in some [starts[i], ends[i])? (no loop)"""
    if len(starts) == 0:
        return np.zeros(total, dtype=bool)
    edges = np.bincount(starts, minlength=total + 1) - np.bincount(ends, minlength=total + 1)
    return np.cumsum(edges[:total]) > 0


def build_samples(records: pl.DataFrame, context: AuditContext, options: MaskOptions) -> SampleBlock:
    """The samples of a block's records (`audit.records.reader.RECORD_COLUMNS`), in their order."""
    prompt = FlatIds.from_series(records["input_ids"])
    output = FlatIds.from_series(records["output_ids"])
    lengths = prompt.lengths + output.lengths
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    output_start = offsets[:-1] + prompt.lengths
    in_output = _ranges(total, output_start, offsets[1:])
    # Each row is its prompt then its output: the output's positions take the output ids in
    # order, the others the prompt ids in order.
    values = np.empty(total, dtype=np.uint32)
    values[in_output] = output.values
    values[~in_output] = prompt.values
    mask = in_output.astype(np.uint8)
    untrained = _untrained_spans(records, context, options, output.lengths)
    if untrained is not None:
        rows, begin, end = untrained
        mask[_ranges(total, output_start[rows] + begin, output_start[rows] + end)] = 0
    return SampleBlock(records["id"], records["line"].to_numpy().astype(np.uint32), values, mask, offsets)


def _untrained_spans(
    records: pl.DataFrame, context: AuditContext, options: MaskOptions, output_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(row, begin, end) of each output span the options leave out of the mask, in output positions."""
    if options.end_of_turn and options.reasoning:
        return None
    batch = Batch(records, context)
    spans: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if not options.end_of_turn:
        run = stop_run(batch).astype(np.int64)
        rows = np.flatnonzero(run)
        spans.append((rows, output_lengths[rows] - run[rows], output_lengths[rows]))
    if not options.reasoning:
        spans.append(_harmony_reasoning(batch) if context.profile.channels is not None else _reasoning(batch))
    rows, begin, end = (np.concatenate(parts) for parts in zip(*spans, strict=True))
    return rows.astype(np.int64), begin.astype(np.int64), end.astype(np.int64)


def _reasoning(batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From the output's start to where its answer starts (the whole output when the reasoning
    never closed), for every record that reasons."""
    bounds = response_bounds(batch).with_columns(pl.Series("length", batch.output_flat.lengths))
    spans = bounds.with_row_index("row").filter(pl.col("reasoning_start").is_not_null()).select(
        "row", pl.lit(0, dtype=pl.Int64).alias("begin"), pl.coalesce("answer_start", "length").alias("end")
    )
    return spans["row"].to_numpy(), spans["begin"].to_numpy(), spans["end"].to_numpy()


def _harmony_reasoning(batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every complete `analysis` message: from just after the previous message's end marker (the
    output's start for the first) through its own end marker."""
    messages = harmony_messages(batch)
    spans = messages.sort("row", "index").with_columns(
        (pl.col("end_at").shift(1).over("row").fill_null(-1) + 1).alias("begin"),
        (pl.col("end_at") + 1).alias("end"),
    ).filter(pl.col("channel") == "analysis")
    return spans["row"].to_numpy(), spans["begin"].to_numpy(), spans["end"].to_numpy()


@dataclass
class LengthTally:
    """What `--max-length` found over the rows it saw."""

    longer: int = 0  # rows longer than the limit
    cut_entirely: int = 0  # rows whose trained tokens all lie past the limit
    dropped: int = 0  # rows left out (`--long drop`; `truncate`: left with no trained token)
    truncated: int = 0  # rows cut to the limit and kept


def apply_length_policy(block: SampleBlock, max_length: int | None, long: str, tally: LengthTally) -> SampleBlock:
    """Count the rows `max_length` concerns and keep, drop or truncate them as `long` says.

    Both trainers cut a row to their maximum length and drop rows left with no trained token,
    silently (SpecForge 0.2.0 `prompt_builder._prompt_from_record`, speculators 0.9.0
    `preprocessing._append_row`); `truncate` does the same here, and says how many.
    """
    if max_length is None:
        return block
    longer = block.lengths > max_length
    cut_entirely = (block.trained() > 0) & (block.trained(max_length) == 0)
    tally.longer += int(longer.sum())
    tally.cut_entirely += int(cut_entirely.sum())
    if long == "keep" or not longer.any():
        return block
    if long == "drop":
        tally.dropped += int(longer.sum())
        return block.take(np.flatnonzero(~longer))
    cut = block.truncated(max_length)
    kept = ~longer | (cut.trained() > 0)  # a row the cut leaves with no trained token goes
    tally.dropped += int((~kept).sum())
    tally.truncated += int((longer & kept).sum())
    return cut if kept.all() else cut.take(np.flatnonzero(kept))


@dataclass
class TrainerLengths:
    """Over the rows written: which a trainer, at its default maximum length, cuts and which it drops.

    Both trainers cut a longer row there (its tokens past it are not trained) and drop a row left
    with no trained token (the rules file of each cites where); neither says so per row.
    """

    trainer: TrainerRules
    rows: int = 0
    longer: int = 0  # rows longer than the trainer's default max_length: cut there
    dropped: int = 0  # of those, rows whose trained tokens all lie past it: dropped
    longest: int = 0  # the longest row's length: what the trainer's setting must reach

    def add(self, block: SampleBlock) -> None:
        if not block.rows:
            return
        limit = self.trainer.max_length
        lengths = block.lengths
        self.rows += block.rows
        self.longer += int((lengths > limit).sum())
        self.dropped += int(((block.trained() > 0) & (block.trained(limit) == 0)).sum())
        self.longest = max(self.longest, int(lengths.max()))

    def summary(self) -> str:
        """One line: `SpecForge 0.2.0: 7 of 9 rows are longer than its default maximum length 2048: ...`."""
        rules = self.trainer
        head = f"{rules.display}: "
        if not self.longer:
            return f"{head}no row is longer than its default maximum length {rules.max_length}"
        dropped = f"drops the {self.dropped} whose trained tokens all lie past it" if self.dropped else "drops none"
        return (
            f"{head}{self.longer} of {self.rows} rows are longer than its default maximum length {rules.max_length}: "
            f"it cuts them there and {dropped}; to train every row whole, pass {rules.length_setting(self.longest)}"
        )

    def to_dict(self) -> dict[str, object]:
        rules = self.trainer
        return {
            "name": rules.name,
            "version": rules.version,
            "max_length": rules.max_length,
            "rows_longer": self.longer,
            "rows_dropped": self.dropped,
            "longest_row": self.longest,
            "setting": rules.length_setting(self.longest) if self.longer else None,
            "summary": self.summary(),
        }
