"""What a drafter trainer's preprocessing does to a conversation, as data: `rules/trainers/*.toml`.

Each file is one pinned release of a trainer, read from its wheel and citing the files: SpecForge
0.2.0's template registry (assistant header, system prompt, end of turn, parser, mask pattern,
ignored texts), its parsers' kept keys and its default `max_length`; speculators 0.9.0's role
map, kept keys and `--seq-length`. A file is checked like a profile: an unknown key, a wrong
type or a name that points nowhere is a one-line ConfigError naming the file and the key.

`resolve_trainer("specforge:qwen3-thinking", profile="qwen3", thinking=True)` is what a run
carries (`--trainer NAME[:TEMPLATE]`): the trainer's rules, the template chosen (SpecForge's
default for the profile when none is named) and the `max_length` it cuts at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.base.config import BUILTIN_RULES_DIR, expect, load_toml, reject_unknown, string_list
from audit.base.errors import ConfigError
from audit.model.families.thinking_modes import ThinkingMode, mode_key, modes_of
from audit.model.trainers.trainer_load import TokenizerLoading, parse_loading

TRAINERS_DIR = BUILTIN_RULES_DIR / "trainers"

_TOP_KEYS = {"name", "version", "display", "source", "preprocessing", "parsers", "patterns", "profiles",
             "no_template", "templates", "roles", "messages", "transformers"}
_TEMPLATE_TEXTS = ("assistant_header", "user_header", "system_prompt", "end_of_turn_token")
_TEMPLATE_KEYS = {*_TEMPLATE_TEXTS, "parser_type", "assistant_pattern_type", "enable_thinking", "ignore_token"}
_PARSER_KEYS = {"keys", "pass_enable_thinking", "enable_thinking_default", "unsupported"}
_PATTERN_KEYS = {"end", "ends", "end_regex", "optional_after_header"}
_MESSAGE_KEYS = {"kept_when_truthy", "reasoning_from", "reasoning_as"}
_ROLES = ("user", "assistant", "system", "tool")


@dataclass(frozen=True)
class TemplateRules:
    """One SpecForge template (`specforge/data/template.py` ChatTemplate): None where SpecForge has None."""

    name: str
    assistant_header: str | None
    user_header: str | None
    system_prompt: str | None
    end_of_turn_token: str | None
    parser_type: str
    assistant_pattern_type: str
    enable_thinking: bool
    ignore_token: tuple[str, ...] | None


@dataclass(frozen=True)
class ParserRules:
    """A SpecForge parser: the message keys it keeps and the thinking switch it passes."""

    keys: tuple[str, ...]
    pass_enable_thinking: bool = False  # enable_thinking=True when the template says so
    enable_thinking_default: bool | None = None  # set unless given (GLMParser)
    unsupported: str | None = None  # why audit does not reimplement it


@dataclass(frozen=True)
class PatternRules:
    """Where the loss mask's group ends after an assistant header (`set_assistant_pattern`)."""

    end: str | None = None  # a template key whose value ends the group
    ends: tuple[str, ...] = ()  # literal texts that end it
    end_regex: str | None = None
    optional_after_header: str | None = None


@dataclass(frozen=True)
class TrainerRules:
    """One trainer release: where it was read from, and what its preprocessing does."""

    name: str
    version: str
    display: str
    source: Path
    cited: str
    max_length: int
    max_length_setting: str  # what a user sets to change it, `{n}` where the length goes
    templates: dict[str, TemplateRules] = field(default_factory=dict)
    parsers: dict[str, ParserRules] = field(default_factory=dict)
    patterns: dict[str, PatternRules] = field(default_factory=dict)
    # profile -> {"thinking" / "no_thinking" -> template}: the template a profile's data is for
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)
    # profile -> why the trainer has no template for that family (`[no_template]`)
    no_template: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # speculators: role name -> role
    messages: dict[str, tuple[str, ...]] = field(default_factory=dict)  # speculators: kept keys
    # The transformers it pins and the folders that release loads otherwise (`[transformers]`).
    loading: TokenizerLoading | None = None

    def length_setting(self, length: int) -> str:
        """What to pass for the trainer to keep `length` tokens: `data.max_length=4096`."""
        return self.max_length_setting.replace("{n}", str(length))


# The server whose reply the trainer view builds from an output where the two differ: a call
# written as one JSON object (Qwen3's) that is not JSON. vLLM's hermes tool parser leaves the whole
# answer as content; SGLang's Qwen25Detector keeps the text before the first call as content,
# the calls that parse, and drops the others (docs/trainer-view.md).
REPLY_SHAPES = ("vllm", "sglang")
# The default time-out of the trainer's own Python (`--trainer-python`) over one answer: its start
# (torch, the trainer and the tokenizer imported and loaded) or one batch of conversations.
PYTHON_TIMEOUT = 300.0


@dataclass(frozen=True)
class Trainer:
    """A trainer as a run uses it: its rules, the template chosen, the length it cuts at, and
    the server whose reply shape the conversations it is given follow (`REPLY_SHAPES`)."""

    rules: TrainerRules
    template: TemplateRules | None
    max_length: int
    reply_shape: str = "vllm"
    # The Python of an environment with the trainer installed (`--trainer-python`): its own code
    # runs there (`audit.model.trainers.installed_trainer`), beside the view's model of it. None: the model.
    python: Path | None = None
    # Seconds that Python's process may take over one answer (its start, or one batch) before it
    # is stopped (`--trainer-timeout`).
    python_timeout: float = PYTHON_TIMEOUT

    @property
    def name(self) -> str:
        return self.rules.name

    @property
    def label(self) -> str:
        """`SpecForge 0.2.0 (qwen3-thinking)`, `speculators 0.9.0`: what findings and summaries name."""
        return f"{self.rules.display} ({self.template.name})" if self.template else self.rules.display

    @property
    def parser(self) -> ParserRules | None:
        return self.rules.parsers[self.template.parser_type] if self.template else None

    @property
    def pattern(self) -> PatternRules | None:
        return self.rules.patterns[self.template.assistant_pattern_type] if self.template else None

    def to_dict(self) -> dict[str, Any]:
        """For the report: which trainer, release, template and length the view modelled."""
        return {
            "name": self.rules.name,
            "version": self.rules.version,
            "template": self.template.name if self.template else None,
            "max_length": self.max_length,
            "reply_shape": self.reply_shape,
            "rules": str(self.rules.source),
            **({"python": str(self.python)} if self.python is not None else {}),
        }


def builtin_trainers() -> dict[str, Path]:
    """Trainer names (`specforge`, `speculators`) and their rule files."""
    found: dict[str, Path] = {}
    for path in sorted(TRAINERS_DIR.glob("*.toml")):
        found[path.stem.rsplit("-", 1)[0]] = path
    return found


def all_trainer_rules() -> list[TrainerRules]:
    """Every built-in trainer's rules, in name order."""
    return [parse_trainer_rules(load_toml(path), path) for path in builtin_trainers().values()]


def load_trainer_rules(name: str) -> TrainerRules:
    """The built-in rules of trainer `name`; ConfigError naming the known ones otherwise."""
    known = builtin_trainers()
    if name not in known:
        raise ConfigError(f"unknown trainer {name!r} (known: {', '.join(known) or 'none'})")
    return parse_trainer_rules(load_toml(known[name]), known[name])


def resolve_trainer(
    spec: str, *, profile: str | None = None, thinking: ThinkingMode = True, max_length: int | None = None,
    reply_shape: str = "vllm",
) -> Trainer:
    """The trainer `spec` (`NAME` or `NAME:TEMPLATE`) names, for data of `profile`."""
    name, _, template_name = spec.strip().partition(":")
    where = f"--trainer {spec}"
    if reply_shape not in REPLY_SHAPES:
        raise ConfigError(f"--reply-shape {reply_shape!r}: choose {' or '.join(REPLY_SHAPES)}")
    try:
        rules = load_trainer_rules(name.strip().lower())
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if max_length is not None and max_length < 1:
        raise ConfigError(f"{where}: max_length must be a positive number of tokens, got {max_length}")
    length = max_length or rules.max_length
    if not rules.templates:
        if template_name:
            raise ConfigError(f"{where}: {rules.display} has no templates; name it alone (--trainer {rules.name})")
        return Trainer(rules, None, length, reply_shape)
    template_name = template_name.strip()
    if not template_name:
        picked: dict[str, str] = {}
        for mode in (mode_key(m) for m in modes_of(thinking)):
            picked[mode] = rules.profiles.get(profile or "", {}).get(mode, "")
            if not picked[mode] and profile in rules.no_template:
                raise ConfigError(f"{where}: {rules.display} has no template for {profile}: {rules.no_template[profile]}")
            if not picked[mode]:
                raise ConfigError(
                    f"{where}: {rules.display} has no template audit picks for profile {profile!r} "
                    f"({mode.replace('_', '-')}); name one as {rules.name}:TEMPLATE "
                    f"(known: {', '.join(rules.templates)})"
                )
        if len(set(picked.values())) > 1:
            # A trainer renders a whole data set with one template: which one is the team's choice.
            raise ConfigError(
                f"{where}: a mixed partition is trained under one template, and {rules.display} has "
                f"{picked['thinking']!r} for thinking and {picked['no_thinking']!r} without; name "
                f"the one you train with as {rules.name}:TEMPLATE"
            )
        template_name = next(iter(picked.values()))
    if template_name not in rules.templates:
        raise ConfigError(
            f"{where}: unknown {rules.display} template {template_name!r} "
            f"(known: {', '.join(rules.templates)})"
        )
    template = rules.templates[template_name]
    parser = rules.parsers[template.parser_type]
    if parser.unsupported:
        raise ConfigError(f"{where}: template {template_name!r} is not modelled: {parser.unsupported}")
    pattern = rules.patterns[template.assistant_pattern_type]
    missing = [key for key in ("assistant_header", pattern.end) if key and getattr(template, key) is None]
    if missing:
        # set_assistant_pattern escapes both: SpecForge itself cannot build this template's parser.
        raise ConfigError(
            f"{where}: {rules.display} cannot use template {template_name!r}: its {missing[0]} is "
            "None, and the parser's set_assistant_pattern raises TypeError on re.escape(None)"
        )
    return Trainer(rules, template, length, reply_shape)


def parse_trainer_rules(data: dict[str, Any], source: Path) -> TrainerRules:
    """Build TrainerRules from parsed TOML, rejecting unknown keys and dangling names."""
    where = str(source)
    reject_unknown(data, _TOP_KEYS, where)
    for key in ("name", "version", "display", "source"):
        if key not in data:
            raise ConfigError(f"{where}: needs `{key}`")
        expect(data[key], str, f"{where}: {key}")
    preprocessing = expect(data.get("preprocessing", {}), dict, f"{where}: [preprocessing]")
    reject_unknown(preprocessing, {"max_length", "max_length_setting"}, f"{where}: [preprocessing]")
    max_length = expect(preprocessing.get("max_length"), int, f"{where}: preprocessing.max_length")
    if max_length < 1:
        raise ConfigError(f"{where}: preprocessing.max_length: expected a positive length, got {max_length}")
    setting = expect(preprocessing.get("max_length_setting"), str, f"{where}: preprocessing.max_length_setting")
    if "{n}" not in setting:
        raise ConfigError(f"{where}: preprocessing.max_length_setting: write {{n}} where the length goes, got {setting!r}")
    parsers = {
        name: _parser(table, f"{where}: [parsers.{name}]")
        for name, table in expect(data.get("parsers", {}), dict, f"{where}: [parsers]").items()
    }
    patterns = {
        name: _pattern(table, f"{where}: [patterns.{name}]")
        for name, table in expect(data.get("patterns", {}), dict, f"{where}: [patterns]").items()
    }
    templates = {
        name: _template(name, table, parsers, patterns, f"{where}: [templates.{name}]")
        for name, table in expect(data.get("templates", {}), dict, f"{where}: [templates]").items()
    }
    profiles: dict[str, dict[str, str]] = {}
    for profile, table in expect(data.get("profiles", {}), dict, f"{where}: [profiles]").items():
        at = f"{where}: [profiles.{profile}]"
        reject_unknown(expect(table, dict, at), {"thinking", "no_thinking"}, at)
        for mode, template in table.items():
            if expect(template, str, f"{at}.{mode}") not in templates:
                raise ConfigError(f"{at}.{mode}: no template {template!r} (known: {', '.join(templates)})")
        profiles[profile] = dict(table)
    no_template = expect(data.get("no_template", {}), dict, f"{where}: [no_template]")
    for profile, why in no_template.items():
        expect(why, str, f"{where}: no_template.{profile}")
    roles = _roles(data.get("roles"), f"{where}: [roles]")
    messages_table = expect(data.get("messages", {}), dict, f"{where}: [messages]")
    reject_unknown(messages_table, _MESSAGE_KEYS, f"{where}: [messages]")
    messages = {
        key: string_list(value, f"{where}: messages.{key}") for key, value in messages_table.items()
    }
    if not templates and not roles:
        raise ConfigError(f"{where}: says nothing a trainer does: give [templates.*] or [roles]")
    return TrainerRules(
        name=data["name"], version=data["version"], display=data["display"], source=source,
        cited=data["source"], max_length=max_length, max_length_setting=setting, templates=templates, parsers=parsers,
        patterns=patterns, profiles=profiles, no_template=no_template, roles=roles, messages=messages,
        loading=parse_loading(data.get("transformers"), where),
    )


def _parser(table: Any, where: str) -> ParserRules:
    expect(table, dict, where)
    reject_unknown(table, _PARSER_KEYS, where)
    if "unsupported" in table:
        return ParserRules(keys=(), unsupported=expect(table["unsupported"], str, f"{where}.unsupported"))
    if "keys" not in table:
        raise ConfigError(f"{where}: needs `keys` (the message keys the parser keeps) or `unsupported`")
    keys = string_list(table["keys"], f"{where}.keys")
    if not {"role", "content"} <= set(keys):
        raise ConfigError(f"{where}.keys: a parser keeps at least role and content, got {list(keys)}")
    default = table.get("enable_thinking_default")
    return ParserRules(
        keys=keys,
        pass_enable_thinking=expect(table.get("pass_enable_thinking", False), bool, f"{where}.pass_enable_thinking"),
        enable_thinking_default=None if default is None else expect(default, bool, f"{where}.enable_thinking_default"),
    )


def _pattern(table: Any, where: str) -> PatternRules:
    expect(table, dict, where)
    reject_unknown(table, _PATTERN_KEYS, where)
    end = table.get("end")
    if end is not None and expect(end, str, f"{where}.end") not in _TEMPLATE_TEXTS:
        raise ConfigError(f"{where}.end: names a template key ({', '.join(_TEMPLATE_TEXTS)}), got {end!r}")
    end_regex = table.get("end_regex")
    if end_regex is not None:
        try:
            re.compile(expect(end_regex, str, f"{where}.end_regex"))
        except re.error as exc:
            raise ConfigError(f"{where}.end_regex: not a regular expression ({exc})") from None
    ends = string_list(table.get("ends", []), f"{where}.ends")
    if end is None and end_regex is None and not ends:
        raise ConfigError(f"{where}: say where a turn ends: `end`, `ends` or `end_regex`")
    after = table.get("optional_after_header")
    return PatternRules(
        end=end, ends=ends, end_regex=end_regex,
        optional_after_header=None if after is None else expect(after, str, f"{where}.optional_after_header"),
    )


def _template(
    name: str, table: Any, parsers: dict[str, ParserRules], patterns: dict[str, PatternRules], where: str
) -> TemplateRules:
    expect(table, dict, where)
    reject_unknown(table, _TEMPLATE_KEYS, where)
    texts = {key: table.get(key) for key in _TEMPLATE_TEXTS}
    for key, value in texts.items():
        if value is not None:
            expect(value, str, f"{where}.{key}")
    parser_type = expect(table.get("parser_type", "general"), str, f"{where}.parser_type")
    if parser_type not in parsers:
        raise ConfigError(f"{where}.parser_type: no [parsers.{parser_type}] (known: {', '.join(parsers)})")
    pattern_type = expect(table.get("assistant_pattern_type", "general"), str, f"{where}.assistant_pattern_type")
    if pattern_type not in patterns:
        raise ConfigError(
            f"{where}.assistant_pattern_type: no [patterns.{pattern_type}] (known: {', '.join(patterns)})"
        )
    ignore = table.get("ignore_token")
    return TemplateRules(
        name=name,
        assistant_header=texts["assistant_header"],
        user_header=texts["user_header"],
        system_prompt=texts["system_prompt"],
        end_of_turn_token=texts["end_of_turn_token"],
        parser_type=parser_type,
        assistant_pattern_type=pattern_type,
        enable_thinking=expect(table.get("enable_thinking", False), bool, f"{where}.enable_thinking"),
        ignore_token=None if ignore is None else string_list(ignore, f"{where}.ignore_token"),
    )


def _roles(table: Any, where: str) -> dict[str, str]:
    if table is None:
        return {}
    expect(table, dict, where)
    roles: dict[str, str] = {}
    for name, role in table.items():
        if expect(role, str, f"{where}.{name}") not in _ROLES:
            raise ConfigError(f"{where}.{name}: a role is one of {', '.join(_ROLES)}, got {role!r}")
        roles[name] = role
    if "other" not in roles:
        raise ConfigError(f"{where}: needs `other`, the role any other name maps to")
    return roles
