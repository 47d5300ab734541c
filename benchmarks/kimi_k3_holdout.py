"""A holdout-like Kimi-K3 partition and its scores: recall over corrupted records, and clean
records flagged at error severity.

Records are rendered segment by segment as the checkpoint's encoding_k3.py renders them (a tag's
special tokens as ids, its name and attributes and every message's content as text encoded on
its own, so content never yields a special id), on the stand-in tokenizer
fixtures/tokenizers/kimi-k3-mini: single- and multi-turn agentic conversations, thinking on and
off, tool calls (some entered straight from the reasoning), tool results that quote the tag
strings. About a quarter are corrupted the ways pipelines break them, one corruption each.

    python benchmarks/kimi_k3_holdout.py [--records 200] [--seed 3] [--out DIR]

prints recall, clean records flagged at error, and the corruptions missed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fixtures.kimi_k3 import TOKENIZER_DIR, build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--thinking", choices=("on", "off", "mixed"), default=None,
                        help="the run's mode (default: the CLI's, thinking on)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="kimi-k3-holdout-"))
    out.mkdir(parents=True, exist_ok=True)
    records, labels = build(args.records, args.seed)
    data = out / "raw_responses.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = out / "report.json"
    mode = ["--thinking", args.thinking] if args.thinking else []
    subprocess.run(
        [sys.executable, "-m", "audit", "check", str(data), "--profile", "kimi-k3", "--tokenizer",
         str(TOKENIZER_DIR), *mode, "--report", str(report), "--format", "json", "--exit-zero"],
        check=True, stdout=subprocess.DEVNULL,
    )
    found = json.loads(report.read_text())
    flagged: dict[int, set[tuple[str, str]]] = {}
    for finding in found["findings"]:
        flagged.setdefault(finding["line"], set()).add((finding["rule"], finding["severity"]))
    errors = {line for line, codes in flagged.items() if any(sev == "error" for _, sev in codes)}
    corrupted = set(labels)
    caught = corrupted & errors
    clean_errors = sorted(errors - corrupted)
    print(f"records {len(records)}, corrupted {len(corrupted)}, recall {len(caught) / max(len(corrupted), 1):.3f}, "
          f"clean at error {len(clean_errors)}")
    internal = [line for line, codes in flagged.items() if any(c == "ERR001" for c, _ in codes)]
    print("internal errors:", internal)
    for line in sorted(corrupted - caught):
        print("missed", line, labels[line], sorted(flagged.get(line, ())))
    for line in clean_errors:
        print("clean flagged", line, sorted(flagged[line]))
    by_kind: dict[str, set[str]] = {}
    for line in sorted(caught):
        by_kind.setdefault(labels[line], set()).update(c for c, s in flagged[line] if s == "error")
    for kind, codes in sorted(by_kind.items()):
        print(f"  {kind}: {' '.join(sorted(codes))}")
    print("data:", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
