"""The tables of a profile file beside its tokens: tool calls, harmony channels, the prompt
endings after a tool result and the template's variables, as specs, each parsed with a one-line
error naming the file and the key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from audit.base.config import expect, reject_unknown, string_list
from audit.base.errors import ConfigError
from audit.model.calls.call_formats import FORMATS, ToolCallFormat
from audit.model.families.prompt_endings import REASONING_STATES, Reasoning, reasoning_left

MODES = ("thinking", "no_thinking")

_CONTINUATION_KEYS = {"suffix", "modes", "reasoning", "rendered"}
# Harmony (gpt-oss): the marker tokens of a message, and the channel names that carry meaning.
CHANNEL_MARKERS = ("start", "channel", "constrain", "message", "end", "call", "return")
_CHANNEL_NAMES = ("reasoning", "answer", "tools")


def marker_value(value: Any, where: str) -> tuple[str, tuple[str, ...] | None]:
    """A marker as a profile writes it: one token's string, or a sequence of pieces (Kimi-K3's
    `["<|open|>", "think", "<|sep|>"]`: special tokens and the text between them, each encoded
    on its own as the family's renderer encodes segment by segment). Returns the marker's text
    (the pieces joined: what a decoded output holds) and its pieces, None for one token."""
    if isinstance(value, list):
        pieces = tuple(expect(piece, str, f"{where}[{i}]") for i, piece in enumerate(value))
        if not pieces or not all(pieces):
            raise ConfigError(f"{where}: a marker sequence needs pieces, none of them empty; got {value!r}")
        return "".join(pieces), pieces if len(pieces) > 1 else None
    text = expect(value, str, where)
    if not text:
        raise ConfigError(f"{where}: expected a token string or a list of pieces, got {value!r}")
    return text, None


def marker_table(table: dict[str, Any], roles: Any, where: str) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """The markers of `roles` in `table` by text, and the pieces of those written as sequences."""
    texts: dict[str, str] = {}
    sequences: dict[str, tuple[str, ...]] = {}
    for role in roles:
        text, pieces = marker_value(table[role], f"{where}.{role}")
        texts[role] = text
        if pieces is not None:
            sequences[text] = pieces
    return texts, sequences


@dataclass(frozen=True)
class ToolCallSpec:
    """The tool-call markers of a family, by string, and the format that orders them."""

    format: ToolCallFormat
    markers: dict[str, str]  # role -> token string (a sequence's pieces joined)
    call_id_pattern: str | None = None
    # Kimi may enter a tool-call section straight from its reasoning, with no </think> (Kimi-K2
    # issue 89): real model behaviour, so such outputs are counted (SEG004), not rejected as a
    # stripped response token. Families that always close reasoning first leave this false.
    may_end_reasoning: bool = False
    # End-of-turn tokens that hand the turn to the tools (GLM's <|observation|>): a turn with
    # tool calls ends with one of them, a turn without calls never does. Empty: any end of turn
    # may follow either.
    end_of_turn: tuple[str, ...] = ()
    # The text around the tool schemas the template writes into the prompt, one JSON object a
    # line (Qwen's and GLM's "<tools>" ... "</tools>"): a record without `tools` still has its
    # parameters' declared types, read from the prompt the model saw. None: not read.
    prompt_tools: tuple[str, str] | None = None
    # The markers written as sequences of pieces (`marker_value`): text -> pieces.
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)


# Kimi-K3's XTML turn: the channels beyond think and tools, each a marker (most of them sequences).
XTML_MARKERS = ("answer_open", "answer_close", "message_close", "open", "close", "separator")


@dataclass(frozen=True)
class XtmlSpec:
    """The channel markers of an XTML turn (Kimi-K3) beside its think and tool markers.

    An output is the rest of an assistant message the generation prompt opened:
    `[reasoning] THINK-CLOSE` (thinking on), `ANSWER-OPEN text ANSWER-CLOSE` (the answer
    channel; the prompt opened it when thinking is off), the tools channel, then MESSAGE-CLOSE
    and the end of turn. `open` and `close` are the special tokens every tag starts with: one
    that no declared marker or call tag accounts for opens or closes an unknown channel;
    `separator` ends every tag.
    """

    markers: dict[str, str]  # role -> text
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)


def parse_xtml(table: Any, where: str) -> XtmlSpec | None:
    if table is None:
        return None
    where = f"{where}: [xtml]"
    expect(table, dict, where)
    reject_unknown(table, set(XTML_MARKERS), where)
    missing = [role for role in XTML_MARKERS if role not in table]
    if missing:
        raise ConfigError(f"{where}: needs {', '.join(missing)}")
    markers, sequences = marker_table(table, XTML_MARKERS, where)
    for role in ("open", "close", "separator"):
        if markers[role] in sequences:
            raise ConfigError(f"{where}.{role}: the tag's special token, one token (not a sequence)")
    return XtmlSpec(markers, sequences)


@dataclass(frozen=True)
class ChannelSpec:
    """Harmony's message markers (by string) and channel names, for families without think tokens.

    An output is a sequence of messages: `<|start|>ROLE` (omitted for the first, which the
    prompt opened), `<|channel|>NAME [to=RECIPIENT] [<|constrain|>FORMAT]`, `<|message|>`,
    content, then `<|end|>`, or `<|call|>` for a tool call, or `<|return|>` for the final answer.
    """

    markers: dict[str, str]  # "start", "channel", ... -> token string
    reasoning: str = "analysis"
    answer: str = "final"
    tools: str = "commentary"
    recipient_pattern: str = r"^functions\.[A-Za-z0-9_.\-]+$"


@dataclass(frozen=True)
class Continuation:
    """A prompt ending other than the generation prompt: an agentic continuation.

    Some templates add no assistant prefix after a tool result (DeepSeek-V3.1, R1): the prompt
    ends with the result and the model goes on; others re-open the reasoning there in their own
    way (DeepSeek-V3.2's `</function_results>\\n\\n<think>`). Each such ending is accepted in
    the listed thinking modes, and leaves the output in its own reasoning state.
    """

    suffix: str
    modes: tuple[str, ...]
    reasoning: Reasoning
    # The mode a prompt ending so was rendered in, when not the run's (Kimi-K3's thinking-off
    # generation prompt, accepted in a thinking run): its records are judged, and TPL001
    # renders them, in that mode. None: the run's.
    rendered: str | None = None


def check_continuation(
    continuation: Continuation,
    ids: tuple[int, ...],
    think_start: int | None,
    think_end: int | None,
    thinking: bool,
    where: str,
) -> None:
    """A continuation's declared state must agree with the think tokens its suffix holds."""
    state = continuation.reasoning
    if think_start is None or think_end is None:
        if state != "none":
            raise ConfigError(f"{where}: the family has no think tokens: its reasoning is 'none'")
        return
    derived = reasoning_left(ids, think_start, think_end, thinking)
    holds_think = think_start in ids or think_end in ids
    off_but_open = not thinking and state != "closed"
    if state == "none" or (holds_think and derived != state) or off_but_open:
        raise ConfigError(
            f"{where}: {continuation.suffix!r} cannot leave reasoning {state!r} "
            f"({'thinking' if thinking else 'no_thinking'}; its think tokens say {derived!r})"
        )


def parse_template(table: Any, modes: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """`[template]`: per thinking mode, the template variables that switch it (a table each)."""
    if table is None:
        return {}
    where = f"{where}: [template]"
    expect(table, dict, where)
    reject_unknown(table, MODES, where)
    for mode, variables in table.items():
        expect(variables, dict, f"{where}.{mode}")
        if mode not in modes:
            raise ConfigError(
                f"{where}.{mode}: [generation_prompt] has no {mode}; give the suffix this mode renders"
            )
    return {mode: dict(variables) for mode, variables in table.items()}


def parse_continuations(value: Any, modes: dict[str, Any], where: str) -> tuple[Continuation, ...]:
    where = f"{where}: [[generation_prompt.continuation]]"
    tables = expect(value, list, where)
    parsed = []
    for number, table in enumerate(tables, start=1):
        here = f"{where} #{number}"
        expect(table, dict, here)
        reject_unknown(table, _CONTINUATION_KEYS, here)
        for key in ("suffix", "reasoning"):
            if key not in table:
                raise ConfigError(f"{here}: needs `{key}`")
        suffix = expect(table["suffix"], str, f"{here}.suffix")
        if not suffix:
            raise ConfigError(f"{here}.suffix is empty; give the text the prompt ends with")
        state = expect(table["reasoning"], str, f"{here}.reasoning")
        if state not in REASONING_STATES:
            known = ", ".join(REASONING_STATES)
            raise ConfigError(f"{here}.reasoning: {state!r} is not one of {known}")
        listed = string_list(table.get("modes", [m for m in MODES if m in modes]), f"{here}.modes")
        unknown = [m for m in listed if m not in modes]
        if unknown or not listed:
            raise ConfigError(
                f"{here}.modes: {unknown[0] if unknown else '[]'!r} is not a mode of the profile "
                f"(it has: {', '.join(m for m in MODES if m in modes)})"
            )
        rendered = table.get("rendered")
        if rendered is not None and expect(rendered, str, f"{here}.rendered") not in modes:
            raise ConfigError(f"{here}.rendered: {rendered!r} is not a mode of the profile")
        parsed.append(Continuation(suffix, listed, state, rendered))
    return tuple(parsed)


def parse_channels(table: Any, where: str) -> ChannelSpec | None:
    if table is None:
        return None
    where = f"{where}: [channels]"
    expect(table, dict, where)
    reject_unknown(table, {*CHANNEL_MARKERS, *_CHANNEL_NAMES, "recipient_pattern"}, where)
    missing = [role for role in CHANNEL_MARKERS if role not in table]
    if missing:
        raise ConfigError(f"{where}: needs {', '.join(missing)}")
    names = {key: expect(table[key], str, f"{where}.{key}") for key in _CHANNEL_NAMES if key in table}
    pattern = table.get("recipient_pattern")
    if pattern is not None:
        _compile(expect(pattern, str, f"{where}.recipient_pattern"), f"{where}.recipient_pattern")
        names["recipient_pattern"] = pattern
    return ChannelSpec(
        markers={role: expect(table[role], str, f"{where}.{role}") for role in CHANNEL_MARKERS}, **names
    )


def _compile(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: not a regular expression: {exc}") from None


def parse_tool_calls(table: Any, where: str) -> ToolCallSpec | None:
    if table is None:
        return None
    where = f"{where}: [tool_calls]"
    expect(table, dict, where)
    format_name = expect(table.get("format"), str, f"{where}.format")
    if format_name not in FORMATS:
        raise ConfigError(f"{where}.format: unknown {format_name!r} (known: {', '.join(FORMATS)})")
    fmt = FORMATS[format_name]
    known = {"format", "call_id_pattern", "may_end_reasoning", "end_of_turn", "prompt_tools"}
    known |= set(fmt.roles)
    reject_unknown(table, known, where)
    missing = [role for role in fmt.roles if role not in table]
    if missing:
        raise ConfigError(f"{where}: format {format_name} needs {', '.join(missing)}")
    pattern = table.get("call_id_pattern")
    if pattern is not None:
        _compile(expect(pattern, str, f"{where}.call_id_pattern"), f"{where}.call_id_pattern")
    markers, sequences = marker_table(table, fmt.roles, where)
    return ToolCallSpec(
        format=fmt,
        markers=markers,
        sequences=sequences,
        call_id_pattern=pattern,
        may_end_reasoning=expect(table.get("may_end_reasoning", False), bool, f"{where}.may_end_reasoning"),
        end_of_turn=string_list(table.get("end_of_turn", []), f"{where}.end_of_turn"),
        prompt_tools=_prompt_tools(table.get("prompt_tools"), f"{where}.prompt_tools"),
    )


def check_call_stops(spec: ToolCallSpec, end_of_turn: tuple[str, ...], eos: tuple[str, ...], where: str) -> None:
    """`tool_calls.end_of_turn` names stop tokens of the profile, and not all of them."""
    if not spec.end_of_turn:
        return
    stops = set(end_of_turn) | set(eos)
    unknown = [t for t in spec.end_of_turn if t not in stops]
    if unknown:
        raise ConfigError(f"{where}: tool_calls.end_of_turn {unknown[0]!r} is not in tokens.end_of_turn or tokens.eos")
    if stops <= set(spec.end_of_turn):
        raise ConfigError(f"{where}: tool_calls.end_of_turn names every stop token: an answer could end with none")


def _prompt_tools(value: Any, where: str) -> tuple[str, str] | None:
    if value is None:
        return None
    texts = string_list(value, where)
    if len(texts) != 2 or not all(texts):
        raise ConfigError(
            f'{where}: expected the two texts around the tool schemas, e.g. ["<tools>", "</tools>"]'
        )
    return texts[0], texts[1]
