"""The Python API: audit or gate a target from a notebook or a pipeline, as the CLI does.

    import audit
    report = audit.check_target("B1_glaive", data_root="prepared")
    report.verdict                      # "pass" | "warn" | "fail"
    report.findings                     # polars DataFrame, the JSON report's finding columns
    audit.gate("B1_glaive", "gated/B1_glaive", data_root="prepared").clean
    audit.export("B1_glaive", "train/B1_glaive", format="jsonl", data_root="prepared").rows
    audit.draft_vocab("B1_glaive", "vocab/B1_glaive", draft_vocab=32_000, data_root="prepared").d2t

Errors are the project's: `ConfigError` (rule set, profile, tokenizer), `InputError` (a
target that cannot be audited), both `AuditError`s; never `SystemExit`. Bad records are never
errors: they are findings.
"""

from __future__ import annotations

import os
from pathlib import Path

from audit.engine.runner import ProgressCallback
from audit.flows.checking import check_session
from audit.flows.draft_vocab import VocabOptions, VocabResult
from audit.flows.draft_vocab import draft_vocab as build_draft_vocab
from audit.flows.export import ExportOptions, ExportResult, SampleOptions, export_samples
from audit.flows.export_rows import MaskOptions
from audit.flows.export_sources import SampleSource, open_source
from audit.flows.gating import GateResult, gate_session
from audit.flows.session import CheckOptions, Session, prepare
from audit.flows.targets import data_root as resolve_data_root
from audit.flows.targets import resolve_target
from audit.model.families.thinking_modes import ThinkingMode
from audit.report.report import Report

PathLike = str | os.PathLike[str]


def _session(
    target: PathLike,
    *,
    profile: str | PathLike | None,
    tokenizer: PathLike | None,
    rules: PathLike | None,
    data_root: PathLike | None,
    thinking: ThinkingMode | None,
    trust_remote_code: bool,
    prompts: PathLike | None,
    jobs: int,
    cache: bool,
    trainer: str | None = None,
    trainer_max_length: int | None = None,
    trainer_python: PathLike | None = None,
    trainer_timeout: float | None = None,
    reply_shape: str | None = None,
) -> Session:
    root, _ = resolve_data_root(None if data_root is None else os.fspath(data_root))
    options = CheckOptions(
        profile=None if profile is None else os.fspath(profile),
        tokenizer=None if tokenizer is None else Path(tokenizer),
        trust_remote_code=trust_remote_code,
        thinking=thinking,
        rules=None if rules is None else Path(rules),
        prompts=None if prompts is None else Path(prompts),
        jobs=jobs,
        cache=cache,
        trainer=trainer,
        trainer_max_length=trainer_max_length,
        trainer_python=None if trainer_python is None else Path(trainer_python),
        trainer_timeout=trainer_timeout,
        trainer_reply_shape=reply_shape,
    )
    return prepare(resolve_target(os.fspath(target), root), options)


def check_target(
    target: PathLike,
    *,
    profile: str | PathLike | None = None,
    tokenizer: PathLike | None = None,
    rules: PathLike | None = None,
    data_root: PathLike | None = None,
    thinking: ThinkingMode | None = None,
    trust_remote_code: bool = False,
    prompts: PathLike | None = None,
    jobs: int = 1,
    cache: bool = True,
    progress: ProgressCallback | None = None,
    trainer: str | None = None,
    trainer_max_length: int | None = None,
    trainer_python: PathLike | None = None,
    trainer_timeout: float | None = None,
    reply_shape: str | None = None,
) -> Report:
    """Audit `target` with the rule set and return its `Report`, as `audit check` does.

    `target` is a partition name under `data_root` (default: `$AUDIT_DATA_ROOT`, else
    `prepared/`), a partition directory or a `.jsonl` file. `profile` (a name or a profile
    file), `tokenizer` (a local Hugging Face tokenizer directory) and `thinking` (True, False,
    or `"mixed"`: each record judged in the mode its prompt ending shows) default to what the
    partition's generation.json records; `rules` to the built-in rule set. The
    tokenizer's own code runs only with `trust_remote_code=True`. `prompts` is a JSONL file of
    the source prompts (TPL001); `jobs` worker processes share the file; `cache=False` audits
    again even when an identical audit is cached. `progress(records, output_tokens, bytes)`
    is called after each block. `trainer` ("specforge[:TEMPLATE]" or "speculators") adds the
    trainer view's findings (TRN) and `report.trainer_view`, its summary; `trainer_max_length`
    the length that trainer cuts at (default: its own); `trainer_python` the Python of an
    environment with that trainer installed, whose own code then runs beside the view's model
    (`trainer_timeout` the seconds its process may take over one answer, default 300);
    `reply_shape` ("vllm", the default, or
    "sglang") the server whose reply the view builds where the two differ (a Qwen3 tool call
    that is not JSON: docs/trainer-view.md).

    Raises `ConfigError` or `InputError` (both `AuditError`) when nothing can be judged.
    """
    session = _session(
        target,
        profile=profile,
        tokenizer=tokenizer,
        rules=rules,
        data_root=data_root,
        thinking=thinking,
        trust_remote_code=trust_remote_code,
        prompts=prompts,
        jobs=jobs,
        cache=cache,
        trainer=trainer,
        trainer_max_length=trainer_max_length,
        trainer_python=trainer_python,
        trainer_timeout=trainer_timeout,
        reply_shape=reply_shape,
    )
    return check_session(session, progress)


def gate(
    target: PathLike,
    out: PathLike,
    *,
    quarantine_on: str = "error",
    force: bool = False,
    profile: str | PathLike | None = None,
    tokenizer: PathLike | None = None,
    rules: PathLike | None = None,
    data_root: PathLike | None = None,
    thinking: ThinkingMode | None = None,
    trust_remote_code: bool = False,
    cache: bool = True,
    progress: ProgressCallback | None = None,
) -> GateResult:
    """Audit `target` and split it into `out`/clean.jsonl and quarantine.jsonl, as `audit gate`
    does.

    Targets and options as for `check_target`. A record is quarantined on a finding of severity
    `error` (`quarantine_on="warning"`: of any severity). Returns the `GateResult`: its
    `report`, the `manifest` written, and the `clean` and `quarantined` counts. Raises
    `InputError` (nothing written) when `out` holds another input's gate and `force` is false,
    when one of its files would replace the input or a file of its partition, or when the
    input cannot be read (then no `out` is made).
    """
    session = _session(
        target,
        profile=profile,
        tokenizer=tokenizer,
        rules=rules,
        data_root=data_root,
        thinking=thinking,
        trust_remote_code=trust_remote_code,
        prompts=None,
        jobs=1,
        cache=cache,
    )
    return gate_session(session, os.fspath(out), quarantine_on=quarantine_on, force=force, progress=progress)


def _sample_source(
    target: PathLike,
    *,
    profile: str | PathLike | None,
    tokenizer: PathLike | None,
    rules: PathLike | None,
    data_root: PathLike | None,
    thinking: ThinkingMode | None,
    trust_remote_code: bool,
    jobs: int,
    cache: bool,
) -> SampleSource:
    root, _ = resolve_data_root(None if data_root is None else os.fspath(data_root))
    options = CheckOptions(
        profile=None if profile is None else os.fspath(profile),
        tokenizer=None if tokenizer is None else Path(tokenizer),
        trust_remote_code=trust_remote_code,
        thinking=thinking,
        rules=None if rules is None else Path(rules),
        jobs=jobs,
        cache=cache,
    )
    return open_source(os.fspath(target), root, options)


def export(
    target: PathLike,
    out: PathLike,
    *,
    format: str = "parquet",  # the name of the CLI's --format
    end_of_turn: bool = True,
    reasoning: bool = True,
    max_length: int | None = None,
    long: str = "keep",
    rows_per_shard: int = 100_000,
    force: bool = False,
    profile: str | PathLike | None = None,
    tokenizer: PathLike | None = None,
    rules: PathLike | None = None,
    data_root: PathLike | None = None,
    thinking: ThinkingMode | None = None,
    trust_remote_code: bool = False,
    jobs: int = 1,
    cache: bool = True,
) -> ExportResult:
    """Write the clean records of `target` as training samples into `out`, as `audit export` does.

    `target` is a partition (checked first, as `check_target` takes it: the records a gate
    keeps are exported) or a gate output directory (its clean.jsonl, as it is). `format`:
    "parquet" (sharded, `rows_per_shard` rows each), "datasets" (a `save_to_disk` directory) or
    "jsonl". Each row: `id`, `line`, `input_ids` (prompt then output ids, unchanged),
    `loss_mask` (0 over the prompt, 1 over the output; `end_of_turn=False` leaves the trailing
    stop ids out of it, `reasoning=False` the reasoning). `max_length` counts the rows longer
    than it; `long` ("keep", "drop", "truncate") says what they become. Whatever they are,
    `summary["trainers"]` says per trainer how many rows its default maximum length cuts and
    drops, and what to pass instead. Returns the `ExportResult` (`summary`: export.json;
    `rows`; `files`; `exit_code()`). Raises `InputError`
    (nothing written) when `out` is not empty and `force` is false, when it would replace an
    input, or when the input cannot be read; an `InputError` saying why (its
    `source` holds the check's report) when no row is left: the command exits 1 on it.
    """
    source = _sample_source(
        target, profile=profile, tokenizer=tokenizer, rules=rules, data_root=data_root, thinking=thinking,
        trust_remote_code=trust_remote_code, jobs=jobs, cache=cache,
    )
    samples = SampleOptions(MaskOptions(end_of_turn=end_of_turn, reasoning=reasoning), max_length=max_length, long=long)
    return export_samples(source, out, ExportOptions(format=format, rows_per_shard=rows_per_shard, force=force), samples)


def draft_vocab(
    target: PathLike,
    out: PathLike,
    *,
    draft_vocab: int,
    tie_break: str = "specforge",
    target_vocab: int | None = None,
    end_of_turn: bool = True,
    reasoning: bool = True,
    max_length: int | None = None,
    long: str = "keep",
    force: bool = False,
    profile: str | PathLike | None = None,
    tokenizer: PathLike | None = None,
    rules: PathLike | None = None,
    data_root: PathLike | None = None,
    thinking: ThinkingMode | None = None,
    trust_remote_code: bool = False,
    jobs: int = 1,
    cache: bool = True,
) -> VocabResult:
    """Count the trained tokens of the samples `export` would write (same target, same options)
    and write the draft vocabulary of the `draft_vocab` most frequent ids into `out`, as `audit
    vocab` does: d2t.npy, t2d.npy, vocab_mapping.safetensors, token_counts.npy, vocab.json.

    `tie_break`: "specforge" (equal counts at the cut-off: the id met first) or "speculators"
    (the smallest id). `target_vocab`: the target model's vocabulary size (default: config.json
    beside the tokenizer, else the tokenizer's). Returns the `VocabResult` (`d2t`, `t2d`,
    `counts`, `summary`: vocab.json with the coverage of the top N).
    """
    source = _sample_source(
        target, profile=profile, tokenizer=tokenizer, rules=rules, data_root=data_root, thinking=thinking,
        trust_remote_code=trust_remote_code, jobs=jobs, cache=cache,
    )
    samples = SampleOptions(MaskOptions(end_of_turn=end_of_turn, reasoning=reasoning), max_length=max_length, long=long)
    options = VocabOptions(draft_size=draft_vocab, tie_break=tie_break, target_size=target_vocab, force=force)
    return build_draft_vocab(source, out, options, samples)
