"""audit: gate LLM-generated token data before it trains an EAGLE-3 drafter.

The public Python API is what `__all__` names, importable from `audit` itself:

    import audit
    report = audit.check_target("B1_glaive")          # a Report: verdict, findings, to_json()
    result = audit.gate("B1_glaive", "gated/B1_glaive")
    audit.export("B1_glaive", "train/B1_glaive")       # training samples: input_ids, loss_mask

Every submodule (`audit.engine.runner`, `audit.records.reader`, `audit.cli`, ...) is internal: importable,
documented, tested, but free to change between versions. ARCHITECTURE.md maps them. Names are
loaded on first use, so `import audit` costs nothing until one is used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the internal module that defines it.
_EXPORTS = {
    "check_target": "audit.api",
    "gate": "audit.api",
    "export": "audit.api",
    "draft_vocab": "audit.api",
    "ExportResult": "audit.flows.export",
    "VocabResult": "audit.flows.draft_vocab",
    "Report": "audit.report.report",
    "RuleResult": "audit.report.report",
    "Verdict": "audit.checks.verdict",
    "GateResult": "audit.flows.gating",
    "iter_quarantine": "audit.flows.gating",
    "AuditError": "audit.base.errors",
    "ConfigError": "audit.base.errors",
    "InputError": "audit.base.errors",
}

__all__ = [
    "AuditError",
    "ConfigError",
    "ExportResult",
    "GateResult",
    "InputError",
    "Report",
    "RuleResult",
    "Verdict",
    "VocabResult",
    "__version__",
    "check_target",
    "draft_vocab",
    "export",
    "gate",
    "iter_quarantine",
]


def __getattr__(name: str) -> object:  # no `typing` import: `import audit` stays ~free
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
