"""`check`: audit a prepared session's target and judge it; the core flow behind `audit check`.

    report = check_session(prepare(target, CheckOptions(profile="kimi-k2.5")))

The audit comes from the result cache when nothing that decides it changed (`audit.flows.cache`),
else from the engine: in this process, over shards in `--jobs` worker processes
(`audit.flows.parallel`), or over shards as tasks on a Ray cluster (`--engine ray`, `audit.flows.cluster`).
The Python API (`audit.check_target`) is this, from a target's name.
"""

from __future__ import annotations

import time
from typing import Any

from audit.base.errors import InputError
from audit.engine.runner import FileAudit, ProgressCallback, audit_file
from audit.flows.cache import AuditCache
from audit.flows.parallel import audit_file_parallel
from audit.flows.session import Session
from audit.model.trainers.trainer_load import installed_load_warning, trainer_encoder
from audit.report.report import Report, build_report


def run_audit(session: Session, progress: ProgressCallback | None = None) -> FileAudit:
    """Audit the session's file: from the cache when nothing changed, else in `jobs` processes
    or on Ray."""
    options = session.options
    path = session.target.data_file
    cache = AuditCache.for_options(options)
    if options.engine == "ray":
        from audit.flows.cluster import audit_on_ray

        return audit_on_ray(session, progress, cache)
    if cache is not None:
        started = time.perf_counter()
        hit = cache.load(cache.key(path, session.context, session.rule_set), path)
        if hit is not None:
            # This run's time (hashing the file, reading the entry), not the stored audit's.
            hit.seconds = time.perf_counter() - started
            return hit
    if options.jobs > 1:
        audited = audit_file_parallel(session, options.jobs, progress)
    else:
        audited = audit_file(
            path,
            session.context,
            session.rule_set,
            block_bytes=options.block_bytes,
            progress=progress,
        )
    if cache is not None and not audited.internal_errors:  # a rerun with --debug must run them again
        # Stored under the content actually audited (the audit hashes what it reads), so a file
        # edited between the lookup and the audit never files its findings under the old bytes.
        cache.store(AuditCache.key_for(audited.sha256, session.context, session.rule_set), audited)
    return audited


def check_session(session: Session, progress: ProgressCallback | None = None) -> Report:
    """Audit the session's target and judge it against the rule set."""
    audited = run_audit(session, progress)
    if audited.records == 0:
        raise InputError(
            f"{session.target.data_file}: no records, only blank lines; nothing to audit"
        )
    trainer = _trainer_description(session)
    return build_report(
        session.target.partition,
        audited,
        session.rule_set,
        profile=session.profile.to_dict(),
        tokenizer=_tokenizer_description(session, trainer),
        trainer=trainer,
    )


def _tokenizer_description(session: Session, trainer: dict[str, Any] | None) -> dict[str, Any]:
    """The run's tokenizer for its report; with `load` (a warning, once per run) where the
    installed transformers' AutoTokenizer encodes the folder otherwise than its tokenizer.json,
    unless the trainer's own load (the same transformers release) already says so."""
    described = session.tokenizer.fingerprint.to_dict()
    load = session.tokenizer.installed_load
    said = (trainer or {}).get("tokenizer_load") or {}
    if load is not None and said.get("transformers") != load["transformers"]:
        described["load"] = {**load, "warning": installed_load_warning(load)}
    return described


def _trainer_description(session: Session) -> dict[str, Any] | None:
    """The run's trainer for its report (None: no trainer view)."""
    trainer = session.context.trainer
    if trainer is None:
        return None
    described = {**trainer.to_dict(), "label": trainer.label}
    loaded = trainer_encoder(trainer.rules.loading, session.tokenizer.directory)
    if loaded is not None:
        described["tokenizer_load"] = {
            "transformers": loaded.transformers, "builds": loaded.rule.builds, "fix": loaded.rule.fix
        }
    return described
