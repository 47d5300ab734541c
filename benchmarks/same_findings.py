"""Do two versions of `audit` give the same findings? Snapshot them, change the code, compare.

    python benchmarks/same_findings.py save BEFORE.json        # before a change
    python benchmarks/same_findings.py compare BEFORE.json     # after it: exit 1 on any difference

Audits every shipped sample partition (fixtures/prepared/*, both thinking modes where the
profile has them, and `--jobs 2`) and the benchmark partitions already built under
benchmarks/.data/ (`--jobs 1` and `--jobs 2`), each in a fresh `audit check --no-cache
--format json` process, and keeps every finding (line, id, rule, severity, position, field,
message), the summary and the serving mix. `compare` runs the same audits again and names
each finding found by one version only. A speed change must leave every one of them as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREPARED = ROOT / "fixtures" / "prepared"
DATA = Path(__file__).resolve().parent / ".data"


def _runs() -> list[tuple[str, Path, list[str]]]:
    """(name, partition, extra arguments) of every audit compared."""
    runs = []
    for partition in sorted(p for p in PREPARED.iterdir() if (p / "raw_responses.jsonl").is_file()):
        runs.append((f"{partition.name}", partition, []))
        runs.append((f"{partition.name} --thinking off", partition, ["--thinking", "off"]))
        runs.append((f"{partition.name} --jobs 2", partition, ["--jobs", "2"]))
    if DATA.is_dir():
        for partition in sorted(p for p in DATA.iterdir() if (p / "generation.json").is_file()):
            if partition.name.endswith("-head3") or "-x" in partition.name:
                continue  # a 3-line head, or a --scale copy of a partition compared already
            runs.append((f"benchmarks/.data/{partition.name}", partition, ["--jobs", "1"]))
            runs.append((f"benchmarks/.data/{partition.name} --jobs 2", partition, ["--jobs", "2"]))
    return runs


def _audit(partition: Path, extra: list[str], cache: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "audit", "check", str(partition), "--no-cache", "--report", str(report),
                "--format", "json", *extra]
        env = {**os.environ, "AUDIT_CACHE_DIR": str(cache)}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if not report.is_file():
            return {"exit": done.returncode, "error": done.stderr.strip().splitlines()[-1:] or ["(no output)"]}
        data = json.loads(report.read_text())
    findings = sorted(
        json.dumps({k: f.get(k) for k in ("line", "id", "rule", "severity", "position", "field", "message")},
                   sort_keys=True)
        for f in data["findings"]
    )
    results = {code: {k: v for k, v in result.items() if k not in ("seconds",)}
               for code, result in (data.get("results") or {}).items()} if isinstance(data.get("results"), dict) \
        else data.get("results")
    return {"exit": done.returncode, "summary": data["summary"], "results": results,
            "serving_mix": (data.get("distributions") or {}).get("serving_mix"), "findings": findings}


def snapshot(cache: Path) -> dict:
    found = {}
    for name, partition, extra in _runs():
        found[name] = _audit(partition, extra, cache)
        print(f"  {name}: {len(found[name].get('findings', []))} findings, exit {found[name]['exit']}", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["save", "compare"])
    parser.add_argument("snapshot", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        found = snapshot(Path(cache))
    if args.action == "save":
        args.snapshot.write_text(json.dumps(found, indent=1, sort_keys=True))
        print(f"saved {sum(len(v.get('findings', [])) for v in found.values())} findings of {len(found)} audits")
        return
    before = json.loads(args.snapshot.read_text())
    differences = 0
    for name in sorted(set(before) | set(found)):
        old, new = before.get(name), found.get(name)
        if old == new:
            continue
        differences += 1
        print(f"DIFFERS: {name}")
        if old is None or new is None:
            print(f"  only {'after' if old is None else 'before'}")
            continue
        for key in ("exit", "summary", "results", "serving_mix", "error"):
            if old.get(key) != new.get(key):
                print(f"  {key}: before {old.get(key)!r:.300}\n  {'':{len(key)}}  after  {new.get(key)!r:.300}")
        gone, came = set(old.get("findings", [])) - set(new.get("findings", [])), \
            set(new.get("findings", [])) - set(old.get("findings", []))
        for finding in sorted(gone)[:10]:
            print(f"  - {finding}")
        for finding in sorted(came)[:10]:
            print(f"  + {finding}")
    print(f"{len(found)} audits compared: {'all identical' if not differences else f'{differences} differ'}")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
