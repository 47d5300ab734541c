"""Rule sets: which rules run, at which severity, and when they warn or fail the gate.

A rule set is a TOML file (`rules/default.toml` unless `--rules FILE`):

    select = ["ALL"]            # codes or prefixes ("TCL"); default ALL
    ignore = ["RTR002"]         # codes or prefixes to leave out

    [rules.TRM001]
    severity = "error"          # "error" or "warning"
    warn_above = 0              # a count of failing records ...
    fail_above = "2%"           # ... or a rate of all records

    [mix]                       # the modes the model is served in (MIX001)
    thinking_off = "10%"        # the least share of records in each

A rule warns when its failing records exceed `warn_above` and fails when they exceed
`fail_above`. Unset: an error rule fails on its first failing record, a warning rule warns
on its first and never fails. Any other key under `[rules.CODE]` is a parameter the rule
declares; anything else is rejected, with the file and key named.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.base.config import BUILTIN_RULES_DIR, expect, load_toml, reject_unknown
from audit.base.errors import ConfigError
from audit.checks import RULES, Rule, Severity
from audit.checks.mix import ServingMix
from audit.checks.verdict import Threshold, judge, threshold_text

DEFAULT_RULE_SET = BUILTIN_RULES_DIR / "default.toml"


@dataclass(frozen=True)
class ConfiguredRule:
    """A rule as a rule set runs it."""

    rule: Rule
    severity: Severity
    warn_above: Threshold | None
    fail_above: Threshold | None

    @property
    def code(self) -> str:
        return self.rule.code

    def verdict(self, failing: int, records: int) -> str:
        """"fail", "warn" or "pass" for this many failing records out of `records`."""
        return judge(failing, records, self.warn_above, self.fail_above)

    @property
    def threshold_text(self) -> str:
        return threshold_text(self.warn_above, self.fail_above)


@dataclass(frozen=True)
class RuleSet:
    """The rules a run applies, in registry order, with where they came from."""

    source: Path
    sha256: str
    rules: tuple[ConfiguredRule, ...]
    # The serving mix the rule set declares (`[mix]`, judged by MIX001), None when it has none.
    mix: ServingMix | None = None

    def __getitem__(self, code: str) -> ConfiguredRule:
        for configured in self.rules:
            if configured.code == code:
                return configured
        raise KeyError(code)

    def __contains__(self, code: str) -> bool:
        return any(configured.code == code for configured in self.rules)


def _matches(code: str, selectors: list[str]) -> bool:
    return any(s == "ALL" or code.startswith(s) for s in selectors)


def load_rule_set(path: Path | None = None, *, options: frozenset[str] = frozenset(), only: str | None = None) -> RuleSet:
    """Load a rule set file (the built-in default when `path` is None).

    A rule that requires a run option (`Rule.requires`, e.g. "trainer") is configured only when
    `options` holds it; `only` keeps just the rules that require that option (the engine's own
    report aside): `audit trainer-view`.
    """
    path = path or DEFAULT_RULE_SET
    if path.is_dir():
        raise ConfigError(f"rule set {path}: is a directory; pass the rule set .toml file itself")
    if not path.is_file():
        raise ConfigError(f"rule set {path}: no such file")
    data = load_toml(path)
    where = str(path)
    reject_unknown(data, {"select", "ignore", "rules", "mix"}, where)
    mix = ServingMix.parse(data["mix"], f"{where}: [mix]") if "mix" in data else None
    select = expect(data.get("select", ["ALL"]), list, f"{where}: select")
    ignore = expect(data.get("ignore", []), list, f"{where}: ignore")
    for selector in [*select, *ignore]:
        if selector != "ALL" and not any(code.startswith(str(selector)) for code in RULES):
            raise ConfigError(f"{where}: select/ignore entry {selector!r} matches no rule code")
    overrides = expect(data.get("rules", {}), dict, f"{where}: [rules]")
    for code in overrides:
        if code not in RULES:
            raise ConfigError(f"{where}: [rules.{code}] is not a rule code (see `audit rules`)")
        if RULES[code].always_on:
            raise ConfigError(
                f"{where}: [rules.{code}] cannot be configured: a record a rule raised on always "
                f"fails the gate and exits 2 (see `audit explain {code}`); remove the table"
            )
    configured = []
    for code, rule_class in RULES.items():
        if not rule_class.always_on and (not _matches(code, select) or _matches(code, ignore)):
            continue
        if rule_class.requires is not None and rule_class.requires not in options:
            continue
        if only is not None and not rule_class.always_on and rule_class.requires != only:
            continue
        configured.append(_configure(rule_class, overrides.get(code, {}), f"{where}: [rules.{code}]"))
    if all(c.rule.always_on for c in configured):
        # A gate that runs no rule passes everything: that is never what a rule set meant.
        if only is not None:
            raise ConfigError(f"{where}: select/ignore leave none of the rules --{only} runs")
        needing = sorted({
            rule.requires for code, rule in RULES.items()
            if rule.requires and rule.requires not in options and _matches(code, select) and not _matches(code, ignore)
        })
        if needing:
            raise ConfigError(f"{where}: the rules select/ignore leave run only with --{needing[0]}")
        raise ConfigError(f"{where}: select/ignore leave no rule to run; select at least one (\"ALL\" runs all)")
    return RuleSet(
        source=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest(), rules=tuple(configured), mix=mix
    )


def _configure(rule_class: type[Rule], table: Any, where: str) -> ConfiguredRule:
    expect(table, dict, where)
    reject_unknown(table, {"severity", "warn_above", "fail_above", *rule_class.parameters}, where)
    severity_name = table.get("severity", rule_class.severity.value)
    try:
        severity = Severity(severity_name)
    except ValueError:
        raise ConfigError(f"{where}.severity: expected \"error\" or \"warning\", got {severity_name!r}") from None
    warn = Threshold.parse(table["warn_above"], f"{where}.warn_above") if "warn_above" in table else None
    fail = Threshold.parse(table["fail_above"], f"{where}.fail_above") if "fail_above" in table else None
    if warn is None and fail is None:
        if severity is Severity.ERROR:
            fail = Threshold(count=0)
        else:
            warn = Threshold(count=0)
    # Each rule declares its parameters with their ranges: a value out of range is named here, in
    # the file and key, before it can crash a run or flag every record.
    parameters = {k: v for k, v in table.items() if k in rule_class.parameters}
    rule_class.validate_parameters(parameters, where)
    return ConfiguredRule(
        rule=rule_class(**parameters), severity=severity, warn_above=warn, fail_above=fail
    )
