"""The files an export writes: JSONL, sharded Parquet, a Hugging Face `datasets` directory.

Each writer takes the samples as a stream of `SampleBlock`s and writes them as they come, so
memory holds a block (and, for Parquet, one row group), never the export:

    jsonl     samples.jsonl: {"id", "line", "input_ids", "loss_mask"} per line (polars
              `write_ndjson` per block)
    parquet   part-00000.parquet, ...: `rows_per_shard` rows each, streamed through polars'
              Parquet sink (`sink_parquet` over a Python source of blocks), the provenance in
              each file's key-value metadata (key `audit.export`)
    datasets  data-00000-of-0000N.arrow (Arrow IPC streams, written batch by batch with
              nanoarrow), dataset_info.json and state.json: what `datasets.Dataset.save_to_disk`
              (datasets >= 4) writes, without `datasets` or pyarrow here; with the `seq_len`
              column (int64, each row's length) and the torch format that `speculators
              prepare-data` saves and `speculators train --data-path` reads (see FEATURES)

With a vision profile every format has a `messages` column beside them
(`audit.flows.export_images`): a nested list, which the datasets writer takes from polars
through an Arrow IPC stream (`_messages_array`).

The files are staged (`ExportDirectory`: temporaries in a directory, uploads under a prefix)
and published together, the summary (`export.json`) last: a directory holding a summary holds
the files it lists.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import polars as pl

from audit.base.errors import InputError
from audit.base.files import (
    TEMPORARY_MARK,
    fsync_directory,
    lock_output,
    open_temporary,
    remove_leftover_temporaries,
    remove_output,
    write_file,
)
from audit.base.object_locks import lock_prefix
from audit.base.storage import LOCK_FILE, ObjectPath, store_errors
from audit.flows.export_images import MESSAGES_DTYPE, MESSAGES_FEATURE
from audit.flows.export_rows import SAMPLE_SCHEMA, SampleBlock
from audit.flows.gate_outputs import Staged

FORMATS = ("parquet", "datasets", "jsonl")
JSONL_FILE = "samples.jsonl"
ROW_GROUP_ROWS = 1024  # a Parquet row group is buffered whole: ~1k samples at a time
PARQUET_METADATA_KEY = "audit.export"
STAGING_SUFFIX = ".partial"  # an upload in object storage before it gets its name

# datasets' features for the columns (the JSON `save_to_disk` writes in datasets >= 4). `seq_len`
# and the torch format are speculators 0.9.0's: `speculators prepare-data` saves input_ids,
# loss_mask and seq_len (the row's length, a Python int: int64) after `set_format(type="torch")`
# (data_generation/preprocessing.py `_append_row`, `build_speculator_training_dataset`), and
# `speculators train --data-path` reads them back with `load_from_disk` (train/data.py
# ArrowDataset): `with_format(None)["seq_len"]` for the packing lengths, and each row's input_ids
# and loss_mask as tensors (`.tolist()`, `torch.equal`). datasets' torch formatter makes every
# integer column int64, as prepare-data's own are.
FEATURES = {
    "id": {"dtype": "string", "_type": "Value"},
    "line": {"dtype": "uint32", "_type": "Value"},
    "input_ids": {"feature": {"dtype": "uint32", "_type": "Value"}, "_type": "List"},
    "loss_mask": {"feature": {"dtype": "uint8", "_type": "Value"}, "_type": "List"},
    "seq_len": {"dtype": "int64", "_type": "Value"},
}
DATASETS_FORMAT = "torch"


@dataclass
class WrittenFile:
    """A staged output, the name it is published under, and the rows in it."""

    staged: Staged
    name: str
    rows: int


Stage = Callable[[str], Staged]


class RowStream:
    """Blocks of samples, taken a number of rows at a time (a block is split where needed)."""

    def __init__(self, blocks: Iterator[SampleBlock]):
        self._blocks = blocks
        self._pending: SampleBlock | None = None

    def has_rows(self) -> bool:
        while self._pending is None or self._pending.rows == 0:
            self._pending = next(self._blocks, None)
            if self._pending is None:
                return False
        return True

    def take(self, rows: int) -> Iterator[SampleBlock]:
        """Up to `rows` rows, in blocks; the rest stays for the next call."""
        left = rows
        while left > 0 and self.has_rows():
            block = self._pending
            assert block is not None
            if block.rows <= left:
                self._pending = None
                left -= block.rows
                yield block
            else:
                self._pending = block.tail(left)
                yield block.head(left)
                left = 0


def write_samples(
    fmt: str, blocks: Iterator[SampleBlock], stage: Stage, *, rows_per_shard: int, provenance: dict[str, Any],
    messages: bool = False,
) -> list[WrittenFile]:
    """Write the samples in `fmt`; the staged files, in order, with their published names.
    `messages`: the blocks carry a `messages` column (every one of them)."""
    if fmt == "jsonl":
        return [_write_jsonl(blocks, stage)]
    stream = RowStream(blocks)
    if fmt == "parquet":
        metadata = {PARQUET_METADATA_KEY: json.dumps(provenance, sort_keys=True)}
        written: list[WrittenFile] = []
        while stream.has_rows():
            name = f"part-{len(written):05d}.parquet"
            written.append(_write_parquet(stream.take(rows_per_shard), stage(name), name, metadata, messages))
        return written
    if fmt == "datasets":
        return _write_datasets(stream, stage, rows_per_shard, provenance, messages)
    raise InputError(f"--format {fmt!r}: choose {', '.join(FORMATS)}")


def _write_jsonl(blocks: Iterator[SampleBlock], stage: Stage) -> WrittenFile:
    out = stage(JSONL_FILE)
    rows = 0
    for block in blocks:
        if block.rows:
            block.frame().write_ndjson(cast(IO[bytes], out))  # a writable: write() is all it uses
            rows += block.rows
    return WrittenFile(out, JSONL_FILE, rows)


def _write_parquet(blocks: Iterator[SampleBlock], out: Staged, name: str, metadata: dict[str, str],
                   messages: bool) -> WrittenFile:
    from polars.io.plugins import register_io_source

    rows = 0
    started = False

    def source(*_: Any) -> Iterator[pl.DataFrame]:
        nonlocal rows, started
        if started:  # the blocks are a stream: read once
            raise RuntimeError("the Parquet sink read its source twice")
        started = True
        for block in blocks:
            rows += block.rows
            yield block.frame()

    schema = {**SAMPLE_SCHEMA, "messages": MESSAGES_DTYPE} if messages else SAMPLE_SCHEMA
    register_io_source(source, schema=schema).sink_parquet(
        cast(IO[bytes], out),  # a writable: write() is all it uses
        metadata=metadata,
        row_group_size=ROW_GROUP_ROWS,
    )
    return WrittenFile(out, name, rows)


# -- the datasets directory ----------------------------------------------------------------------


def features(messages: bool) -> dict[str, Any]:
    """datasets' features of the columns written."""
    return {**FEATURES, "messages": MESSAGES_FEATURE} if messages else FEATURES


def _messages_array(series: pl.Series) -> Any:
    """A messages column as one nanoarrow array. polars hands nested columns over only as a
    whole; an IPC stream at its oldest compatibility level gives large lists and strings (no
    views), which datasets reads."""
    import nanoarrow
    from nanoarrow.ipc import InputStream

    buffer = io.BytesIO()
    series.to_frame().write_ipc_stream(buffer, compat_level=pl.CompatLevel.oldest())
    buffer.seek(0)
    return nanoarrow.c_array_stream(InputStream.from_readable(buffer)).get_next().child(0)


def _arrow_schema(provenance: dict[str, Any], messages: bool) -> Any:
    import nanoarrow

    fields = {
        "id": nanoarrow.string(),
        "line": nanoarrow.uint32(),
        "input_ids": nanoarrow.list_(nanoarrow.uint32()),
        "loss_mask": nanoarrow.list_(nanoarrow.uint8()),
        "seq_len": nanoarrow.int64(),
    }
    if messages:
        fields["messages"] = _messages_array(pl.Series("messages", [], dtype=MESSAGES_DTYPE)).schema
    # The schema metadata datasets' own writer adds: the features, so that a shard read alone
    # (`Dataset.from_file`) has them too.
    metadata = {"huggingface": json.dumps({"info": {"features": features(messages)}}), PARQUET_METADATA_KEY: json.dumps(provenance, sort_keys=True)}
    return nanoarrow.Schema(nanoarrow.struct(fields, nullable=False), metadata=metadata)


def _record_batch(schema: Any, block: SampleBlock) -> Any:
    """A block as one Arrow record batch (a struct array), from its buffers."""
    import nanoarrow

    if len(block.values) >= 2**31:
        raise InputError("a block of samples over 2**31 ids cannot be one Arrow batch")
    offsets = block.offsets.astype(np.int32)

    def lists(values: np.ndarray, item: Any) -> Any:
        child = nanoarrow.c_array_from_buffers(item, len(values), [None, values])
        return nanoarrow.c_array_from_buffers(nanoarrow.list_(item), block.rows, [None, offsets], children=[child])

    ids = block.record_ids
    text = ids.fill_null("").str.join("").item().encode("utf-8") if block.rows else b""
    string_offsets = np.zeros(block.rows + 1, dtype=np.int32)
    np.cumsum(ids.str.len_bytes().fill_null(0).to_numpy(), out=string_offsets[1:])
    valid = np.packbits(ids.is_not_null().to_numpy(), bitorder="little")
    children = [
        nanoarrow.c_array_from_buffers(nanoarrow.string(), block.rows, [valid, string_offsets, text], null_count=ids.null_count()),
        nanoarrow.c_array_from_buffers(nanoarrow.uint32(), block.rows, [None, block.lines.astype(np.uint32)]),
        lists(block.values, nanoarrow.uint32()),
        lists(block.mask, nanoarrow.uint8()),
        nanoarrow.c_array_from_buffers(nanoarrow.int64(), block.rows, [None, block.lengths.astype(np.int64)]),
        *([] if block.messages is None else [_messages_array(block.messages)]),
    ]
    return nanoarrow.c_array_from_buffers(schema, block.rows, [None], children=children)


def _write_datasets(stream: RowStream, stage: Stage, rows_per_shard: int, provenance: dict[str, Any],
                    messages: bool) -> list[WrittenFile]:
    from nanoarrow.ipc import StreamWriter

    schema = _arrow_schema(provenance, messages)
    shards: list[WrittenFile] = []
    while stream.has_rows():
        out = stage(f"data-{len(shards):05d}.arrow")
        writer = StreamWriter.from_writable(out)
        rows = 0
        for block in stream.take(rows_per_shard):
            writer.write_array(_record_batch(schema, block))
            rows += block.rows
        writer.close()  # the end-of-stream marker
        shards.append(WrittenFile(out, "", rows))
    for index, shard in enumerate(shards):
        shard.name = f"data-{index:05d}-of-{len(shards):05d}.arrow"
    return shards


def datasets_metadata(shards: list[WrittenFile], stage: Stage, messages: bool = False) -> list[WrittenFile]:
    """dataset_info.json and state.json beside the shards, as `save_to_disk` writes them."""
    info = {"citation": "", "description": "", "features": features(messages), "homepage": "", "license": ""}
    fingerprint = hashlib.sha256("".join(s.staged.summary(s.rows)["sha256"] for s in shards).encode()).hexdigest()
    state: dict[str, Any] = {
        "_data_files": [{"filename": shard.name} for shard in shards],
        "_fingerprint": fingerprint[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": DATASETS_FORMAT,
        "_output_all_columns": False,
        "_split": None,
    }
    written = []
    for name, content in (("dataset_info.json", info), ("state.json", state)):
        out = stage(name)
        out.write(json.dumps(content, indent=2).encode() + b"\n")
        written.append(WrittenFile(out, name, 0))
    return written


# -- the output directory ------------------------------------------------------------------------


class ExportDirectory:
    """An output directory (or object storage prefix) for one run's files, the summary last.

    `owned` matches the names this kind of output writes: with `force`, an earlier run's files
    of those names that this run does not write again are removed once the new ones are in
    place; nothing else in the directory is touched.
    """

    def __init__(self, out: Path | ObjectPath, summary_name: str, owned: re.Pattern[str]):
        self.out = out
        self.summary_name = summary_name
        self.owned = owned
        self._lock: Any = None
        self._staged: list[Staged] = []  # staged and not yet published: discarded on the way out

    def __enter__(self) -> ExportDirectory:
        if isinstance(self.out, ObjectPath):
            self._lock = lock_prefix(self.out)
        else:
            self._lock = lock_output(self.out)
            remove_leftover_temporaries(self.out)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            for staged in self._staged:
                with suppress(Exception):  # already gone, or the store unreachable: nothing is published
                    staged.discard()
        finally:
            self._lock.release()

    def entries(self) -> list[str]:
        """The names in the output, the lock and unfinished temporaries aside."""
        if not self.out.exists():
            return []
        return sorted(
            path.name for path in self.out.iterdir() if path.name != LOCK_FILE and TEMPORARY_MARK not in path.name
        )

    def refuse_unless(self, force: bool, what: str) -> None:
        """An output holding anything is someone's: write there only with `force`; unless it
        holds an earlier output of this kind and nothing else (its summary and the files the
        summary lists): running the same command again replaces it, as `audit gate` does."""
        present = self.entries()
        if present and not force and not self._earlier_output(present):
            shown = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
            raise InputError(f"--out {self.out} is not empty ({shown}): pass --force to write the {what} there anyway, or choose another --out")

    def _earlier_output(self, present: list[str]) -> bool:
        """Does the directory hold exactly a whole earlier output of this kind (read as untrusted:
        anything unexpected in the summary means no)?"""
        if self.summary_name not in present:
            return False
        try:
            summary = json.loads((self.out / self.summary_name).read_bytes())
            listed = {entry["path"] for entry in summary["files"]}
            ours = summary["tool"]["name"] == "audit"
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return ours and all(isinstance(name, str) for name in listed) and set(present) <= listed | {self.summary_name}

    def stage(self, name: str) -> Staged:
        if isinstance(self.out, ObjectPath):
            # Uploaded under a staging name, moved to its own once every file is written (a
            # datasets shard is named by the count of shards).
            staged = Staged(name, (self.out / f"{name}{STAGING_SUFFIX}").open("wb"))
        else:
            staged = Staged(name, open_temporary(self.out, name))
        self._staged.append(staged)
        return staged

    def publish(self, files: list[WrittenFile], summary: bytes) -> None:
        """Put the files in place under their names, remove stale files of ours, write the summary."""
        names = {written.name for written in files} | {self.summary_name}
        stale = [name for name in self.entries() if self.owned.match(name) and name not in names]
        if isinstance(self.out, ObjectPath):
            self._publish_objects(self.out, files, summary, stale)
            self._staged.clear()
            return
        directory = self.out
        for written in files:
            written.staged.file.sync()
        # The old summary goes first, the new one comes last: a directory with a summary holds
        # what it lists, even after a crash between the steps.
        remove_output(directory / self.summary_name)
        fsync_directory(directory)
        for written in files:
            written.staged.file.commit(directory / written.name, sync_directory=False)
        for name in stale:
            remove_output(directory / name, follow=False)
        fsync_directory(directory)
        write_file(directory / self.summary_name, [summary])
        self._staged.clear()

    def _publish_objects(self, prefix: ObjectPath, files: list[WrittenFile], summary: bytes, stale: list[str]) -> None:
        (prefix / self.summary_name).unlink(missing_ok=True)
        filesystem = prefix.filesystem
        for written in files:
            written.staged.file.close()  # completes the upload
            with store_errors(prefix):
                filesystem.mv(str(prefix / f"{written.staged.name}{STAGING_SUFFIX}"), str(prefix / written.name))
        for name in stale:
            (prefix / name).unlink(missing_ok=True)
        (prefix / self.summary_name).write_bytes(summary)
