"""What a rule sees: one batch of parsed records, and the run they belong to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import nanoarrow
import numpy as np
import orjson
import polars as pl

from audit.model.families.profiles import ResolvedProfile
from audit.model.tokens.flat_ids import FlatIds, MarkerIndex, marker_view
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.trainers.trainer_rules import Trainer
from audit.records.contract import (
    RecordContract,
    all_in_vocabulary,
    contract_failures,
    record_contract,
)
from audit.records.images import ImageSource

# The column of output ids as the markers see them (`Batch.with_marker_ids`).
MARKER_IDS = "marker_ids"

# What a record's own line contributes to its source prompt.
_PROMPT_FIELDS = ("messages", "tools", "chat_template_kwargs")


@dataclass
class AuditContext:
    """Everything fixed for a run: the resolved profile and the tokenizer in use."""

    profile: ResolvedProfile
    tokenizer: Tokenizer
    # Source prompts by sample id (`--prompts FILE`), for the template-fidelity rule.
    prompts: dict[str, dict[str, Any]] | None = None
    # The trainer whose preprocessing the trainer view models (`--trainer`), or None: no view.
    trainer: Trainer | None = None
    # Where the images records name are read (the data file's folder), for the image rules.
    images: ImageSource = field(default_factory=ImageSource)
    contract: RecordContract = field(init=False)

    def __post_init__(self) -> None:
        self.contract = record_contract(self.tokenizer)


class Batch:
    """A frame of records (see `audit.records.reader.RECORD_COLUMNS`) plus work shared between rules.

    Shared work is computed once, on first use, for all rules: here the contract failures and
    the decoded output text (one batched tokenizer call); a family's rules add their own
    through `shared` (the parsed tool calls, the harmony messages).
    """

    def __init__(
        self,
        records: pl.DataFrame,
        context: AuditContext,
        source_prompts: dict[int, dict[str, Any]] | None = None,
    ):
        self.records = records
        self.context = context
        self._memo: dict[Callable[[Batch], Any], Any] = {}
        self._prompts: dict[int, dict[str, Any] | None] = {}
        # The prompts the reader parsed, by line (`ParsedBlock.source_prompts`): the `source`
        # column's objects, not read from its JSON again. Without them, that JSON is read.
        self.source_prompts = source_prompts

    def source_prompt(self, row: int) -> dict[str, Any] | None:
        """The source prompt of a record (`messages`, `tools`, `chat_template_kwargs`), or None.

        From the record's own line when it carries `messages` or `tools`, else from the
        `--prompts` file by sample id. Read on demand and once per row: rules that need it only
        for some records (the tool calls' declared types) never parse the others.
        """
        if row not in self._prompts:
            records = self.records
            self._prompts[row] = self._read_prompt(records["source"][row], records["line"][row], records["id"][row])
        return self._prompts[row]

    def source_prompts_of_all(self) -> list[dict[str, Any] | None]:
        """`source_prompt(row)` of every row, in order: for a rule that reads them all (TPL001),
        the columns are read once, not a value at a time (~4 us a row)."""
        columns = (self.records[name].to_list() for name in ("source", "line", "id"))
        for row, (source, line, sample_id) in enumerate(zip(*columns, strict=True)):
            if row not in self._prompts:
                self._prompts[row] = self._read_prompt(source, line, sample_id)
        return [self._prompts[row] for row in range(self.height)]

    def _read_prompt(self, source: str | None, line: int, sample_id: str | None) -> dict[str, Any] | None:
        if source is not None and self.source_prompts is not None:
            prompt = self.source_prompts.get(line)
            if prompt is not None:
                return prompt
        if source is not None:
            try:
                value = orjson.loads(source)
            except orjson.JSONDecodeError:
                value = None
            if isinstance(value, dict) and (
                isinstance(value.get("messages"), list) or isinstance(value.get("tools"), list)
            ):
                # Only the prompt's fields: the line's id lists would stay in memory with it.
                return {name: value[name] for name in _PROMPT_FIELDS if name in value}
        prompts = self.context.prompts
        if prompts is not None and sample_id is not None:
            return prompts.get(sample_id)
        return None

    def shared(self, compute: Callable[[Batch], Any]) -> Any:
        """`compute(self)`, which several rules need (e.g. the parsed tool calls), once per batch."""
        if compute not in self._memo:
            self._memo[compute] = compute(self)
        return self._memo[compute]

    @property
    def profile(self) -> ResolvedProfile:
        return self.context.profile

    @property
    def tokenizer(self) -> Tokenizer:
        return self.context.tokenizer

    @property
    def height(self) -> int:
        return self.records.height

    @cached_property
    def contract_failures(self) -> pl.DataFrame:
        """`row`, `rule`, `column` of every contract failure in this batch."""
        return contract_failures(self.context.contract, self.records)

    @cached_property
    def output_flat(self) -> FlatIds:
        """`output_ids` of every row as one flat array (a missing list is empty; see
        `output_present`)."""
        return FlatIds.from_series(self.records["output_ids"])

    @cached_property
    def input_flat(self) -> FlatIds:
        """`input_ids` of every row as one flat array (a missing list is empty)."""
        return FlatIds.from_series(self.records["input_ids"])

    @cached_property
    def output_present(self) -> np.ndarray:
        """Per row: does the record have `output_ids` at all?"""
        return self.records["output_ids"].is_not_null().to_numpy()

    @cached_property
    def marker_flat(self) -> FlatIds:
        """The output ids as the markers see them: each marker the profile writes as a sequence
        of ids (Kimi-K3's `<|open|>think<|sep|>`) is its virtual id at its first position and a
        filler at the others (`audit.model.tokens.flat_ids.marker_view`), at the same positions. For a
        family whose markers are all single ids, `output_flat` itself. Compare marker ids with
        this, decode `output_flat`."""
        return marker_view(self.output_flat, self.profile.sequences)

    @property
    def marker_column(self) -> str:
        """The column a rule's list expressions compare marker ids with: `output_ids` itself,
        or for a family with sequence markers `marker_ids` (`marker_flat` as a list column,
        which `with_marker_ids` adds to a frame of this batch's records)."""
        return MARKER_IDS if self.profile.sequences else "output_ids"

    def with_marker_ids(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame` (one row per record, in order) with the `marker_ids` column when the family
        has sequence markers; unchanged otherwise."""
        if not self.profile.sequences:
            return frame
        flat, present = self.marker_flat, self.output_present
        lists = [
            flat.values[flat.offsets[i] : flat.offsets[i + 1]].tolist() if present[i] else None
            for i in range(len(flat))
        ]
        return frame.with_columns(pl.Series(MARKER_IDS, lists, dtype=pl.List(pl.Int64)))

    @cached_property
    def markers(self) -> MarkerIndex:
        """Where the profile's markers (think, stop, tool-call, tool-result and channel tokens)
        occur in each output, in the marker view: found once per batch, asked by many rules."""
        return MarkerIndex(self.marker_flat, self.profile.marker_ids)

    @cached_property
    def decodable(self) -> pl.Series:
        """Rows whose output can be decoded: present, and every id inside the vocabulary."""
        if "contract_failures" in self.__dict__ and self.contract_failures.is_empty():
            # The contract, worked out already (INT002's), found every present output's ids in
            # the vocabulary: no second pass over them.
            return self.records["output_ids"].is_not_null()
        return self.records.select(
            all_in_vocabulary(self.tokenizer, pl.col("output_ids")).fill_null(False)
        ).to_series()

    @cached_property
    def decodable_rows(self) -> np.ndarray:
        """Indices of the decodable rows, in order."""
        return self.decodable.arg_true().to_numpy()

    @cached_property
    def decodable_output(self) -> FlatIds:
        """`output_ids` of the decodable rows as one flat array (no Python lists)."""
        if len(self.decodable_rows) == self.height:  # nearly always: every row's, as they are
            return self.output_flat
        return FlatIds.from_series(self.records["output_ids"].gather(self.decodable_rows))

    @property
    def decoded_texts(self) -> list[str]:
        """`decode(output_ids)` of each decodable row, special tokens kept: made from
        `decoded_output` each time asked, not kept (the round trip's encode reads them once)."""
        column = self.decoded_output
        if len(self.decodable_rows) < self.height:
            column = column.gather(self.decodable_rows)
        return column.to_list()

    @cached_property
    def decoded_output(self) -> pl.Series:
        """`decode(output_ids)` with special tokens kept; null where the ids cannot be decoded."""
        texts = decoded_column(self.tokenizer, self.decodable_output, "decoded_output")
        if len(self.decodable_rows) == self.height:
            return texts
        full = pl.Series("decoded_output", [None] * self.height, dtype=pl.String)
        if len(self.decodable_rows):
            full = full.scatter(self.decodable_rows, texts)
        return full


def decoded_column(tokenizer: Tokenizer, flat: FlatIds, name: str) -> pl.Series:
    """`tokenizer.decode_flat(flat)` as a String column, decoded once: from the byte table's
    bytes when each sequence's are UTF-8 (one buffer handed to polars, ~5x faster than reading
    each Python string again, and no Python string made at all), else from the texts
    (`Tokenizer.texts_of`: some the tokenizer's lossy decoding)."""
    decoded = tokenizer.decode_flat_bytes(flat)
    if decoded is not None:
        data, offsets = decoded
        array = nanoarrow.c_array_from_buffers(nanoarrow.large_binary(), len(offsets) - 1, [None, offsets, data])
        try:  # (polars checks each sequence's bytes: one that is not UTF-8 on its own refuses)
            return pl.Series(array).cast(pl.String).alias(name)
        except pl.exceptions.ComputeError:
            pass
    return pl.Series(name, tokenizer.texts_of(flat, decoded), dtype=pl.String)
