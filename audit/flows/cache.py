"""Incremental re-audit: an unchanged partition, audited the same way, is not audited again.

A result is stored under a key made of everything that decides it:

* the file's content: its sha256, hashed afresh on every lookup (size, mtime and inode can
  all be restored after an edit; hashing costs a fraction of a second per 200 MB),
* the rule set (every selected rule with its severity, thresholds and parameters),
* the resolved profile and anything else in the audit context (e.g. `--prompts`; for a
  family that reads images, every file beside the data file, where records name them, known
  by its name, size, inode and times: one `stat` a file, see `_images_digest`),
* the tokenizer's fingerprint (a hash of its files) and the decode/encode backend,
* the tool: its version and a hash of its own source code, so an edited rule never reads a
  result its old code produced.

Any change gives another key, so stale results are never read; they are simply not found.
The store is a directory (default `.audit-cache/` in the working directory, or
`$AUDIT_CACHE_DIR`): one folder per result holding the findings and per-record stats as
Parquet and the counts as JSON. Deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from audit import __version__
from audit.base.errors import InputError
from audit.base.files import write_directory_atomically
from audit.base.storage import AnyPath
from audit.engine.findings import FindingsLog
from audit.engine.runner import STATS_SCHEMA, FileAudit
from audit.flows.targets import DATA_FILE
from audit.model.tokens.fastcodec import fast_paths_enabled

if TYPE_CHECKING:
    from audit.checks.ruleset import RuleSet
    from audit.records.batch import AuditContext
    from audit.records.images import ImageSource

CACHE_DIR_ENV = "AUDIT_CACHE_DIR"
DEFAULT_CACHE_DIR = Path(".audit-cache")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Bumped when the stored layout changes.
_LAYOUT = 2


def default_cache_dir() -> Path:
    """`$AUDIT_CACHE_DIR`, else `.audit-cache/` in the working directory."""
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The tool's version and a hash of its own Python source (rules, engine, reader...)."""
    digest = hashlib.sha256(f"audit {__version__} layout {_LAYOUT}".encode())
    package = Path(__file__).resolve().parent.parent  # audit/, this module is audit/flows/cache.py
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe_rules(rule_set: RuleSet) -> list[Any]:
    return [
        [
            c.code,
            c.severity.value,
            str(c.warn_above),
            str(c.fail_above),
            sorted((k, repr(v)) for k, v in c.rule.options.items()),
        ]
        for c in rule_set.rules
    ]


def _describe_context(context: AuditContext) -> dict[str, str]:
    described: dict[str, str] = {}
    for item in dataclasses.fields(context):
        value = getattr(context, item.name)
        if item.name == "contract":
            continue  # derived from the tokenizer
        if item.name == "tokenizer":
            described[item.name] = json.dumps(value.fingerprint.to_dict(), sort_keys=True)
        elif item.name == "images":
            described[item.name] = _images_digest(value, context)
        elif item.name == "prompts" and value is not None:
            # Keys in their own order: a template's `tojson` writes them so, and the prompts'
            # ids depend on it (sorted, two files rendering differently would share a result).
            described[item.name] = hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()
        else:
            # Reprs name functions by address (a profile's call reader): drop what moves between runs.
            described[item.name] = _ADDRESS.sub("", repr(value))
    return described


# A file changed less than this long before the key is made is hashed whole: its times may not
# have moved yet past those of an earlier change (file times move by the kernel's clock tick).
_RECENT_NS = 2_000_000_000


def _images_digest(images: ImageSource, context: AuditContext) -> str:
    """Every file beside the data file, for a family that reads images (the records name them
    by path there): an image replaced, fixed or broken gives another key. Other families read no
    file but the data, and their key is the folder's name only.

    A file is known by its name, size, inode and times, not its content, so that a folder of
    many images costs one `stat` each, not a read: its change time (`st_ctime_ns`) is set by
    the kernel on every write and cannot be set back (`utime` sets only the access and
    modification times), so a file edited and given its old mtime still changes the key. A
    file changed in the last two seconds is hashed too (a change within one clock tick of
    another leaves its times as they were)."""
    if images.folder is None or context.profile.vision is None:
        return repr(images)
    digest = hashlib.sha256(str(images.folder).encode())
    now = time.time_ns()
    for directory, folders, files in os.walk(images.folder):
        folders.sort()
        for name in sorted(files):
            path = Path(directory, name)
            relative = str(path.relative_to(images.folder))
            if relative == DATA_FILE:
                continue
            try:
                status = path.stat()
            except OSError:
                digest.update(b"\0" + relative.encode() + b"\0unreadable")
                continue
            stamp = f"{relative}\0{status.st_size}\0{status.st_ino}\0{status.st_mtime_ns}\0{status.st_ctime_ns}"
            digest.update(b"\0" + stamp.encode())
            if now - max(status.st_mtime_ns, status.st_ctime_ns) < _RECENT_NS:
                with contextlib.suppress(OSError), path.open("rb") as handle:
                    digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


class AuditCache:
    """Results of earlier audits, by key; see the module docstring for what the key covers."""

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def for_options(cls, options: Any) -> AuditCache | None:
        """The cache a run uses, or None when `--no-cache` turned it off, when a trainer's own
        environment runs (`--trainer-python`: it may change under the same path unseen), or
        when remote images are fetched (`--fetch-images`: likewise under the same URL)."""
        if not getattr(options, "cache", True) or getattr(options, "trainer_python", None) is not None:
            return None
        if getattr(options, "fetch_images", False):
            return None  # remote images may change under the same URL, unseen
        root = getattr(options, "cache_dir", None)
        return cls(Path(root) if root is not None else default_cache_dir())

    # -- content hash -------------------------------------------------------------------------
    @staticmethod
    def content_sha256(path: AnyPath) -> str:
        """sha256 of the file, read in full every time: the cache trusts no file metadata.

        InputError when it cannot be read, as the audit's own reading says it
        (`audit.records.sources.file_chunks`): every command that looks in the cache first.
        """
        try:
            with path.open("rb") as handle:
                return hashlib.file_digest(handle, "sha256").hexdigest()
        except OSError as exc:
            raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None

    def key(self, path: AnyPath, context: AuditContext, rule_set: RuleSet) -> str:
        """The key of auditing `path` with this context and rule set."""
        return self.key_for(self.content_sha256(path), context, rule_set)

    @staticmethod
    def key_for(sha256: str, context: AuditContext, rule_set: RuleSet) -> str:
        """The key of auditing content with this sha256, context and rule set."""
        parts = {
            "content": sha256,
            "rules": _describe_rules(rule_set),
            "context": _describe_context(context),
            "backend": "fast" if fast_paths_enabled() else "plain",
            "code": code_fingerprint(),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    # -- results ------------------------------------------------------------------------------
    def load(self, key: str, path: AnyPath) -> FileAudit | None:
        """The stored result for `key`, or None (never raises: a broken entry is a miss)."""
        entry = self.root / "results" / key
        try:
            meta = json.loads((entry / "meta.json").read_text())
            log = FindingsLog.load(entry, meta["findings"])
            stats = pl.read_parquet(entry / "stats.parquet")
            if stats.schema != pl.Schema(STATS_SCHEMA):
                return None
            return FileAudit(
                path=path,
                sha256=meta["sha256"],
                bytes=meta["bytes"],
                lines=meta["lines"],
                records=meta["records"],
                output_tokens=meta["output_tokens"],
                log=log,
                seconds=meta["seconds"],
                stats=stats,
                cached=True,
            )
        except Exception:  # missing, partial or unreadable: audit again  # noqa: BLE001
            return None

    def store(self, key: str, audited: FileAudit) -> None:
        """Keep `audited` under `key`; a cache that cannot be written is skipped, not fatal."""

        def fill(entry: Path) -> None:
            findings = audited.log.save(entry)
            audited.stats.write_parquet(entry / "stats.parquet")
            meta = {
                "sha256": audited.sha256,
                "bytes": audited.bytes,
                "lines": audited.lines,
                "records": audited.records,
                "output_tokens": audited.output_tokens,
                "seconds": audited.seconds,
                "source": str(audited.path),
                "findings": findings,
            }
            (entry / "meta.json").write_text(json.dumps(meta))

        # The same key is the same result, and another run may be reading it: kept as it is.
        with contextlib.suppress(OSError):
            write_directory_atomically(self.root / "results" / key, fill, complete="meta.json")
