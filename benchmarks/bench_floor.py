"""The floor: the work no audit of a file can skip, done as plainly and as fast as it can be.

    python benchmarks/bench_floor.py DATA_FILE TOKENIZER_DIR     # one process; JSON on stdout
    taskset -c 0 python benchmarks/bench_floor.py ...           # pinned to one core, as judged

Every audit must read every line, decode every output to bytes and encode it again with the
fastest exact encoder to know whether the ids are the ones the tokenizer would choose (the
round trip), and compare. Here that is: orjson parses each line, a numpy gather over the
tokenizer's id -> bytes table decodes a batch of outputs at once (the chunked gather of
`audit.model.tokens.fastcodec.ByteDecoder`, the fastest decode there is), fastokens encodes the texts
into one flat buffer, numpy compares. No rule, no report, no findings. It is judged as a whole
process, as the tool is (interpreter start and imports in: `bench_check.py` times the process),
less the byte table's build, which it reports as `table_seconds` (an audit keeps the table in
its tokenizer cache); building the fastokens encoder is in (nothing can keep it between
processes). `seconds` is its loop alone. `bench_check.py` reports the tool's times as ratios to
this, measured in the same run.
"""

from __future__ import annotations

import json
import sys
import time
from itertools import chain
from pathlib import Path

import numpy as np
import orjson

BATCH_LINES = 2_000


def floor(data: Path, tokenizer_dir: Path) -> dict:
    """Read, decode, re-encode and compare every output of `data`; seconds and counts."""
    import fastokens
    import tokenizers

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from audit.model.tokens.fastcodec import byte_decoder_for_backend
    from audit.model.tokens.flat_ids import FlatIds

    table_started, table_cpu = time.perf_counter(), time.process_time()
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    table = byte_decoder_for_backend(backend, backend.get_vocab_size(with_added_tokens=True))
    table_seconds, table_cpu = time.perf_counter() - table_started, time.process_time() - table_cpu
    if table is None:
        raise SystemExit(f"{tokenizer_dir}: not a byte-level BPE; the floor needs its byte table")
    lengths = table.lengths

    started = time.perf_counter()
    encoder = fastokens.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    records = ids = differ = 0
    outputs: list[list[int]] = []

    def run(batch: list[list[int]]) -> None:
        nonlocal ids, differ
        sizes = np.fromiter((len(o) for o in batch), dtype=np.int64, count=len(batch))
        try:
            flat = np.fromiter(chain.from_iterable(batch), dtype=np.int64, count=int(sizes.sum()))
        except (TypeError, ValueError, OverflowError):  # a list of something else than ids: left out
            batch = [o for o in batch if all(type(i) is int and 0 <= i < 1 << 62 for i in o)]
            sizes = np.fromiter((len(o) for o in batch), dtype=np.int64, count=len(batch))
            flat = np.fromiter(chain.from_iterable(batch), dtype=np.int64, count=int(sizes.sum()))
        ids += len(flat)
        unknown = (flat < 0) | (flat >= len(lengths))
        if unknown.any():  # ids the tokenizer lacks: no text to compare (the audit names them apart)
            sequence = np.repeat(np.arange(len(sizes)), sizes)
            keep = ~np.isin(np.arange(len(sizes)), sequence[unknown])
            flat, sizes = flat[np.repeat(keep, sizes)], sizes[keep]
        # decode: the byte table's chunked gather (the tool's own, the fastest there is), then UTF-8
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        text_bytes, cuts = table.decode_bytes(FlatIds(flat, offsets))
        view = memoryview(text_bytes.data)
        texts = [str(view[a:b], "utf-8", "replace") for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)]
        # encode and compare
        again, offsets = encoder.encode_batch_flat(texts, add_special_tokens=False)
        again_ids = np.frombuffer(again, dtype=np.uint32)
        again_offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        same_length = np.diff(again_offsets) == sizes
        differ += int((~same_length).sum())
        if same_length.all():
            mismatch = again_ids != flat
            if mismatch.any():
                differ += len(np.unique(np.searchsorted(again_offsets, np.flatnonzero(mismatch), side="right")))

    with data.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            records += 1
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # not a record: nothing to decode
            output = record.get("output_ids") if isinstance(record, dict) else None
            if isinstance(output, list):
                outputs.append(output)
            if len(outputs) == BATCH_LINES:
                run(outputs)
                outputs = []
    if outputs:
        run(outputs)
    return {"seconds": time.perf_counter() - started, "table_seconds": table_seconds, "table_cpu": table_cpu, "records": records, "ids": ids,
            "differ": differ}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    print(json.dumps(floor(Path(sys.argv[1]), Path(sys.argv[2]))))
