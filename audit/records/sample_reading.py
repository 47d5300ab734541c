"""Reading again lines the strict reader accepted: only the fields a training sample is made of.

An export reads a partition a second time, after its check. When the rule set quarantines
every line the strict reader refuses (its UNREADABLE and CONTRACT rules at severity error, as
by default), every line the export keeps was read strictly before and accepted: here each is
parsed once by simdjson, and only `id`, the id lists (int64 buffers, as `audit.records.id_lists`
reads them) and the finish reason's type are taken, several times faster than the strict
reading (`audit.records.reader.parse_block`), which does everything else too. The values are the
strict reading's: the same JSON values (the caller checks that the bytes are the ones audited,
by their sha256), `id` written as the reader writes it, `prompt_ids` for an absent `input_ids`.

The caller's rule set is what makes this exact: a line this reading meets that is plainly not
one the strict reader accepted (not an object, an id list of other values, an id outside
[0, 2**32)) raises `NotAccepted`, and the caller reads the block strictly, but the strict
reader's every check (a key given twice, say) is not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl
import simdjson

from audit.records.id_lists import ids_column
from audit.records.line_reading import CONTRACT, TOKEN_ID_LIMIT, UNREADABLE
from audit.records.sources import LineBlock

# The columns of a frame of sample fields, one row per record.
SAMPLE_FIELDS: dict[str, pl.DataType] = {
    "line": pl.UInt32(),
    "id": pl.String(),
    "input_ids": pl.List(pl.Int64()),
    "output_ids": pl.List(pl.Int64()),
    "finish_type": pl.String(),
}
# The kinds of problem a rule set must quarantine for the lines it keeps to be read this way.
STRICTLY_REFUSED = (UNREADABLE, CONTRACT)


class NotAccepted(ValueError):
    """A line the strict reader would not have accepted as it is read here."""


def read_sample_fields(block: LineBlock, skip: Iterable[int] = ()) -> pl.DataFrame:
    """The sample fields (`SAMPLE_FIELDS`) of the block's records, except the lines in `skip`."""
    skipped = set(skip)
    parser = simdjson.Parser()
    lines: list[int] = []
    ids: list[str | None] = []
    prompts: list[np.ndarray | None] = []
    outputs: list[np.ndarray | None] = []
    finishes: list[str | None] = []
    for line, raw in block.record_lines():
        if line in skipped:
            continue
        if line in block.long_lines:
            raise NotAccepted(f"line {line} is too long to read")
        record_id, prompt, output, finish = _fields(parser, raw.rstrip(b"\r"))
        lines.append(line)
        ids.append(record_id)
        prompts.append(prompt)
        outputs.append(output)
        finishes.append(finish)
    frame = pl.DataFrame(
        [
            pl.Series("line", lines, dtype=pl.UInt32),
            pl.Series("id", ids, dtype=pl.String),
            ids_column("input_ids", prompts),
            ids_column("output_ids", outputs),
            pl.Series("finish_type", finishes, dtype=pl.String),
        ]
    )
    for column in ("input_ids", "output_ids"):
        values = frame[column]
        if values.list.min().min() is not None and (values.list.min().min() < 0 or values.list.max().max() >= TOKEN_ID_LIMIT):  # type: ignore[operator]
            raise NotAccepted(f"{column} holds an id outside [0, 2**32)")
    return frame


def _fields(parser: Any, text: bytes) -> tuple[str | None, np.ndarray | None, np.ndarray | None, str | None]:
    """A line's id, prompt ids, output ids and finish type, checked as the strict reader checks
    these fields (`audit.records.line_reading._field_problem`)."""
    document = None
    try:
        document = parser.parse(text)
        if not isinstance(document, simdjson.Object):
            raise NotAccepted("not a JSON object")
        record_id = _text(document["id"]) if "id" in document else None
        prompt = _ids(document.get("input_ids"))
        if prompt is None:
            prompt = _ids(document.get("prompt_ids"))
        output = _ids(document.get("output_ids"))
        return record_id, prompt, output, _finish_type(document.get("meta_info"))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise NotAccepted(str(exc)) from None
    finally:
        del document  # the parser is reused only once nothing refers to its last document


def _finish_type(meta: Any) -> str | None:
    if meta is None:
        return None
    if not isinstance(meta, simdjson.Object):
        raise NotAccepted("meta_info is not an object")
    finish = meta.get("finish_reason")
    if finish is None:
        return None
    if not isinstance(finish, simdjson.Object):
        raise NotAccepted("finish_reason is not an object")
    kind = finish.get("type")
    if not isinstance(kind, str):
        raise NotAccepted("finish_reason.type is not a string")
    return kind


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise NotAccepted("id is neither a string nor an integer")


def _ids(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if not isinstance(value, simdjson.Array):
        raise NotAccepted("an id list that is not a list")
    ids = np.frombuffer(value.as_buffer(of_type="i"), dtype=np.int64)
    if len(ids) != len(value):  # as_buffer flattens nested arrays
        raise NotAccepted("an id list holding lists")
    return ids
