"""Prompt rows streamed from the containers datasets come in: JSONL, Parquet, Arrow, `datasets` folders.

`open_container(path, split)` says what a path holds, from its first bytes, not its name:

| container | how it is read |
|---|---|
| JSONL (any other file) | a line at a time; a row is one JSON object |
| Parquet (`PAR1`) | polars, `BATCH_ROWS` rows at a time, only the columns a prompt is made of |
| Arrow IPC file (`ARROW1`) | polars (memory-mapped), `BATCH_ROWS` rows at a time |
| Arrow IPC stream (what `datasets` writes) | nanoarrow, one record batch at a time |
| `Dataset.save_to_disk` folder | its `state.json`'s `data-*.arrow` streams, in order |
| `DatasetDict.save_to_disk` folder | the `split` (default `train`) named in `dataset_dict.json` |

`iter_rows(container)` yields `Row`s, so memory follows one batch (one line for JSONL, at most
`MAX_ROW_BYTES`; a stream's record batch as its writer cut it), never the file. A row knows where it is: `file:line` for JSONL (from 1, as
editors count), `file row N` for tables (from 0, as `datasets` and polars index them), and the
stable id made from the container's name and that number, used when the row has none. What is
wrong with the container (no such file, a line that is not JSON, a folder without its
`state.json`, a data file that links out of its folder) is an InputError naming the file and
row; what is wrong with a row's conversation is `audit.generate.conversations`' business. A
JSONL line that is not a JSON object is a `BadLine` error, or, when the caller skips bad
lines, a `Row` that says what is wrong with it (`problem`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from audit.base.errors import InputError
from audit.generate.image_parts import IMAGE_COLUMNS
from audit.records.sources import MAX_LINE_BYTES

# Rows per batch read from a table: a few megabytes of chat text.
BATCH_ROWS = 1024
# A JSONL line longer than this is not read into memory: its row is refused as too large (the
# bound the audit's reading puts on a line).
MAX_ROW_BYTES = MAX_LINE_BYTES
# The columns a prompt is made of; a table's other columns are never read.
PROMPT_COLUMNS = (
    "id",
    "prompt_id",
    "conversation_id",
    "messages",
    "conversations",
    "conversation",
    "prompt",
    "system",
    "tools",
    "chat_template_kwargs",
    *IMAGE_COLUMNS,  # (strings, or `datasets` Images: {"bytes", "path"})
)
# A table needs one of these to hold prompts at all.
CONVERSATION_COLUMNS = ("messages", "conversations", "conversation", "prompt")
DEFAULT_SPLIT = "train"
CONTAINER_KINDS = {
    "parquet": "Parquet",
    "arrow-file": "an Arrow IPC file",
    "arrow-stream": "an Arrow IPC stream",
    "datasets": "an Arrow IPC stream",
}
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Row:
    """One row of a container: its columns, or only how large it was when too large to read, or
    what is wrong with a JSONL line skipped as bad."""

    number: int  # the line (JSONL, from 1) or the row (tables, from 0)
    where: str  # "data.jsonl:12" or "data.parquet row 12", for messages
    row_id: str  # the stable id made from the container's name and the number
    value: dict[str, Any] | None  # None when the row was too large to read, or a bad line skipped
    from_table: bool  # a table's struct columns give every field, null where a row had none
    size: int = 0  # the bytes of a JSONL line too large to read
    problem: str | None = None  # why a JSONL line is not a row, when bad lines are skipped


class BadLine(InputError):
    """A JSONL line that is not a JSON object: where it is, and why."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class Container:
    """What a prompts path holds and the files to read, in order."""

    kind: str  # "jsonl", "parquet", "arrow-file", "arrow-stream" or "datasets"
    path: Path
    label: str  # the name stable ids are made from: the file, or the folder (and split)
    files: tuple[Path, ...]


def open_container(path: Path, split: str | None = None) -> Container:
    """What `path` holds; InputError naming it when it holds no prompts we can read.

    `split` picks a split of a `DatasetDict` folder (default `train`); any other container has
    no splits, so naming one is an error rather than silently ignored.
    """
    if path.is_dir():
        return _datasets_folder(path, split)
    if not path.is_file():
        raise InputError(
            f"{path}: no such prompts file (JSONL, Parquet, Arrow or a `datasets` folder)"
        )
    if split is not None:
        raise InputError(
            f"{path}: --split {split!r} names a split of a `datasets` DatasetDict folder; "
            "this is a single file"
        )
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the prompts file ({exc.strerror})") from None
    if head.startswith(b"PAR1"):
        kind = "parquet"
    elif head.startswith(b"ARROW1"):
        kind = "arrow-file"
    elif head.startswith(b"\xff\xff\xff\xff"):
        kind = "arrow-stream"
    else:
        kind = "jsonl"
        if head.removeprefix(_BOM).lstrip().startswith(b"["):
            raise InputError(
                f"{path}: a JSON array, not JSON lines; write one object a line, e.g. "
                f"`jq -c '.[]' {path.name} > {path.stem}.jsonl`"
            )
    return Container(kind, path, path.name, (path,))


def _datasets_folder(path: Path, split: str | None) -> Container:
    """A `Dataset.save_to_disk` folder, or the split of a `DatasetDict.save_to_disk` folder."""
    label, root = path.name, path
    if (path / "dataset_dict.json").is_file():
        splits = _json_file(path / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise InputError(f"{path}/dataset_dict.json: `splits` must be a list of split names")
        chosen = split or DEFAULT_SPLIT
        if chosen not in splits or not _plain_name(chosen):
            raise InputError(
                f"{path}: a DatasetDict with the splits {', '.join(map(repr, splits)) or 'none'} "
                f"and no {chosen!r}; pick one with --split NAME"
            )
        path, label = path / chosen, f"{path.name}/{chosen}"
    elif split is not None:
        raise InputError(
            f"{path}: --split {split!r} names a split of a DatasetDict folder (with a "
            "dataset_dict.json); this folder holds one dataset"
        )
    elif (path.parent / "dataset_dict.json").is_file():
        # A split folder given directly keeps the ids it has when picked with --split.
        label = f"{path.parent.name}/{path.name}"
    state_file = path / "state.json"
    if not state_file.is_file():
        raise InputError(
            f"{path}: a folder, but not one `datasets`' save_to_disk wrote (no state.json or "
            "dataset_dict.json); pass a JSONL, Parquet or Arrow file, or such a folder"
        )
    entries = _json_file(state_file).get("_data_files")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{state_file}: `_data_files` must list the folder's data-*.arrow files")
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _plain_name(name):
            raise InputError(
                f"{state_file}: `_data_files` names {name!r}, not a file in {path}"
            )
        if not (path / name).is_file():
            raise InputError(f"{state_file}: lists {name}, which is not in {path}")
        _inside(root, path / name)
        files.append(path / name)
    return Container("datasets", path, label, tuple(files))


def _inside(root: Path, file: Path) -> None:
    """Refuse a data file that is, or is reached through, a link out of the folder `root`: data
    inside a folder is never a path outside it (a link would read whatever it names)."""
    target = file.resolve()
    if not target.is_relative_to(root.resolve()):
        raise InputError(
            f"{file}: a link to {target}, outside {root}; a `datasets` folder's data files "
            "must be in it (copy the file in, or pass the folder it is in)"
        )


def _plain_name(name: str) -> bool:
    """A file or split name inside the folder: no separators, no `..`, nothing hidden."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    return value


def iter_rows(container: Container, skip_bad_lines: bool = False) -> Iterator[Row]:
    """The container's rows in order, one batch in memory at a time.

    A JSONL line that is not a JSON object raises `BadLine`; with `skip_bad_lines`, it is a
    `Row` with no value and its `problem`, for the caller to count and report."""
    if container.kind == "jsonl":
        yield from _jsonl_rows(container, skip_bad_lines)
        return
    number = 0
    for file in container.files:
        for frame in _table_batches(container, file):
            for value in frame.iter_rows(named=True):
                where = f"{container.path} row {number}"
                yield Row(number, where, f"{container.label}:{number}", value, True)
                number += 1


def _jsonl_rows(container: Container, skip_bad_lines: bool) -> Iterator[Row]:
    path = container.path
    with path.open("rb") as handle:
        number = 0
        while raw := handle.readline(MAX_ROW_BYTES + 1):
            number += 1
            where, row_id = f"{path}:{number}", f"{container.label}:{number}"
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                    size += len(rest)
                yield Row(number, where, row_id, None, False, size + len(rest))
                continue
            if number == 1:
                raw = raw.removeprefix(_BOM)
            if not raw.strip():
                continue
            try:
                value = _json_object(raw, where)
            except BadLine as bad:
                if not skip_bad_lines:
                    raise
                yield Row(number, where, row_id, None, False, len(raw), problem=bad.reason)
                continue
            yield Row(number, where, row_id, value, False)


def _json_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadLine(where, f"not valid JSON ({exc}); each line must be one JSON object") from None
    if not isinstance(value, dict):
        raise BadLine(
            where, f"expected a JSON object (a prompt or a conversation), got a {type(value).__name__}"
        )
    return value


def _table_batches(container: Container, file: Path) -> Iterator[Any]:
    """polars frames of `file`'s prompt columns, a batch at a time.

    Parquet is read `BATCH_ROWS` rows a query (polars' own streaming of a scan runs ahead of
    its reader and held ~2x the memory for a 10x longer file; a slice reads only the row
    groups it needs); an Arrow file, memory-mapped by polars, likewise in `BATCH_ROWS`; an
    Arrow stream, a record batch at a time as its writer cut them (`datasets` writes 1,000 rows).
    """
    import polars as pl  # here: a JSONL run never loads it

    try:
        if container.kind == "parquet":
            scan = pl.scan_parquet(file)
            wanted = _wanted(file, scan.collect_schema().names())
            total = scan.select(pl.len()).collect().item()
            for offset in range(0, total, BATCH_ROWS):
                yield scan.select(wanted).slice(offset, BATCH_ROWS).collect()
            return
        if container.kind == "arrow-file":
            scan = pl.scan_ipc(file)
            wanted = _wanted(file, scan.collect_schema().names())
            yield from scan.select(wanted).collect_batches(chunk_size=BATCH_ROWS)
            return
        yield from _stream_batches(file)
    except InputError:
        raise
    except Exception as exc:  # polars and nanoarrow raise many types for a damaged file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"{file}: cannot be read as {CONTAINER_KINDS[container.kind]} ({reason[:200]})"
        ) from None


def _stream_batches(file: Path) -> Iterator[Any]:
    """An Arrow IPC stream's record batches, through nanoarrow; polars reads the types it lacks."""
    import nanoarrow as na
    import polars as pl

    try:
        stream = na.ArrayStream.from_path(str(file))
        schema = stream.schema
    except Exception:
        # nanoarrow reads no view types (polars writes strings as views): read it whole.
        frame = pl.read_ipc_stream(file)
        yield frame.select(_wanted(file, frame.columns))
        return
    with stream:
        names = [schema.field(i).name for i in range(schema.n_fields)]
        wanted = _wanted(file, names)
        for batch in stream:
            yield pl.DataFrame([pl.Series(n, batch.child(names.index(n))) for n in wanted])


def _wanted(file: Path, names: list[str]) -> list[str]:
    """The prompt columns of a table; InputError when it has no conversation column at all."""
    if not any(name in names for name in CONVERSATION_COLUMNS):
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise InputError(
            f"{file}: no column a prompt is made of ({', '.join(CONVERSATION_COLUMNS)}); "
            f"its columns: {shown or 'none'}"
        )
    return [name for name in names if name in PROMPT_COLUMNS]
