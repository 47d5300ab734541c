"""Model profiles: a family's special tokens, named by their strings, as data in `rules/profiles/`.

A `Profile` is what the TOML file says; `Profile.resolve(tokenizer, thinking=...)` looks every string
up in the tokenizer in use and returns a `ResolvedProfile` of ids (ids move between tokenizer releases
of one family). A pinned id (`[pinned_ids]`) the tokenizer disagrees with is a configuration error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from audit.base.config import BUILTIN_RULES_DIR, expect, load_toml, reject_unknown, string_list
from audit.base.errors import ConfigError
from audit.model.families.marker_sequences import MarkerIds, widths
from audit.model.families.profile_tables import (
    ChannelSpec,
    Continuation,
    ToolCallSpec,
    XtmlSpec,
    check_call_stops,
    marker_table,
    parse_channels,
    parse_continuations,
    parse_template,
    parse_tool_calls,
    parse_xtml,
)
from audit.model.families.prompt_endings import THINKING_STATES, Reasoning
from audit.model.families.thinking_modes import (
    MIXED,
    ThinkingMode,
    mode_key,
    modes_of,
    resolve_endings,
)
from audit.model.families.vision import ResolvedVision, VisionSpec, parse_vision
from audit.model.rendering.rendered_endings import as_rendered
from audit.model.rendering.templating import CHAT_TEMPLATE, RENDERERS, thinking_kwargs
from audit.model.tokens.tokenizer import Tokenizer

PROFILES_DIR = BUILTIN_RULES_DIR / "profiles"

_TOP_KEYS = {"name", "description", "encoder", "tokens", "pinned_ids", "generation_prompt", "tool_calls",
             "channels", "template", "vision", "xtml"}
_TOKEN_KEYS = {"think_start", "think_end", "end_of_turn", "eos", "think_open_window", "tool_result", "thinking_token"}
_PROMPT_KEYS = {"thinking", "no_thinking", "continuation", "as_template_renders"}


@dataclass(frozen=True)
class Profile:
    """A model family's token vocabulary for the rules, as written in its TOML file."""

    name: str
    description: str
    source: Path
    think_start: str | None
    think_end: str | None
    end_of_turn: tuple[str, ...]
    eos: tuple[str, ...]
    prompt_suffixes: dict[str, tuple[str, ...]]  # "thinking" / "no_thinking" -> suffix texts
    pinned_ids: dict[str, int] = field(default_factory=dict)
    tool_calls: ToolCallSpec | None = None
    think_open_window: int = 0
    channels: ChannelSpec | None = None
    # The family's built-in prompt encoder (a name in audit.model.rendering.templating.RENDERERS), for models
    # that ship Python instead of a chat template; None: the tokenizer's chat template.
    encoder: str | None = None
    # Markers that open or close a tool result (the prompt's, never an output's): single tokens are
    # found by id, markers spelled as text (DeepSeek-V3.2's `<function_results>`) in the decoded answer.
    tool_result: tuple[str, ...] = ()
    # The template variables that set each thinking mode (`[template]`: "thinking" /
    # "no_thinking" -> variables), for families whose template reads its own switch
    # (MiniMax-M3's `thinking_mode`); a mode not named gets `thinking_kwargs`.
    thinking_switch: dict[str, dict[str, Any]] = field(default_factory=dict)

    def template_kwargs(self, thinking: bool) -> dict[str, Any]:
        """The template variables that render a prompt in this thinking mode, for the generator
        and TPL001 alike: the profile's `[template]` entry, else `thinking` and `enable_thinking`."""
        mode = mode_key(thinking)
        if mode in self.thinking_switch:
            return dict(self.thinking_switch[mode])
        return thinking_kwargs(thinking)
    # Prompt endings after a tool result (agentic continuations), each with its reasoning state.
    continuations: tuple[Continuation, ...] = ()
    vision: VisionSpec | None = None  # the image placeholder's tokens and the processor's defaults
    # Markers written as sequences of special tokens and text (Kimi-K3's XTML tags): each
    # marker's text -> its pieces. Resolved, each gets a virtual id (`ResolvedProfile.sequences`).
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    xtml: XtmlSpec | None = None  # the channels of an XTML turn beside think and tools (Kimi-K3)
    # A token the prompt holds only with thinking on (Gemma-4's `<|think|>`): its mode (PRM001).
    thinking_token: str | None = None
    # The endings are several template revisions': a folder accepts those its template renders.
    as_template_renders: bool = False

    def resolve(self, tokenizer: Tokenizer, *, thinking: ThinkingMode = True) -> ResolvedProfile:
        """Look every token string up in `tokenizer`; raise ConfigError on any disagreement.
        `thinking`: the run's mode, or `"mixed"` for the endings of both, each record in its own."""
        where = f"profile {self.name} ({self.source})"
        # Each marker's id: a token's, or a virtual one for a sequence (above the vocabulary).
        token = MarkerIds(tokenizer, self.sequences, where)
        token.check_pins(self.pinned_ids)

        think_start = token(self.think_start) if self.think_start else None
        think_end = token(self.think_end) if self.think_end else None
        listed = (tokenizer, self.template_kwargs, self.prompt_suffixes, self.continuations)
        suffixes, continuations = as_rendered(*listed) if self.as_template_renders else listed[2:]
        endings = resolve_endings(
            suffixes, continuations, tokenizer, thinking, think_start, think_end, where,
            token.sequences, mode_by_token=self.thinking_token is not None,
        )

        spelled = tuple(t for t in self.tool_result if tokenizer.token_id(t) is None)
        markers: dict[str, int] = {}
        text_markers: dict[str, str] = {}
        call_stops: tuple[int, ...] = ()
        if self.tool_calls is not None and self.tool_calls.format.unit == "text":
            # A format whose markers this vocabulary spells as text: found in the decoded answer.
            text_markers = dict(self.tool_calls.markers)
        elif self.tool_calls is not None:
            markers = {role: token(text) for role, text in self.tool_calls.markers.items()}
            call_stops = tuple(token(text) for text in self.tool_calls.end_of_turn)

        def roles(spec: ChannelSpec | XtmlSpec | None) -> dict[str, int]:
            return {role: token(text) for role, text in spec.markers.items()} if spec is not None else {}

        channel_markers, xtml_markers = roles(self.channels), roles(self.xtml)

        return ResolvedProfile(
            profile=self,
            thinking=thinking,
            thinking_token=token(self.thinking_token) if self.thinking_token else None,
            think_start=think_start,
            think_end=think_end,
            end_of_turn=tuple(token(t) for t in self.end_of_turn),
            eos=tuple(token(t) for t in self.eos),
            prompt_suffixes=endings.ids,
            prompt_suffix_texts=endings.texts,
            reasoning=endings.reasoning,
            suffix_reasoning=endings.states,
            suffix_modes=endings.modes,
            tool_markers=markers,
            tool_text_markers=text_markers,
            channel_markers=channel_markers,
            tool_result=tuple(token(t) for t in self.tool_result if t not in spelled),
            tool_result_text=spelled,
            call_stops=call_stops,
            vision=self.vision.resolve(token, tokenizer.directory) if self.vision else None,
            xtml_markers=xtml_markers,
            sequences=token.sequences,
        )


@dataclass(frozen=True)
class ResolvedProfile:
    """A profile with every token resolved to its id in the tokenizer in use."""

    profile: Profile
    thinking: ThinkingMode  # the run's mode: True, False, or MIXED (each record in its ending's)
    think_start: int | None
    think_end: int | None
    end_of_turn: tuple[int, ...]
    eos: tuple[int, ...]
    prompt_suffixes: tuple[tuple[int, ...], ...]
    prompt_suffix_texts: tuple[str, ...]
    reasoning: Reasoning  # the state the generation prompt (the first suffix) leaves
    tool_markers: dict[str, int]  # role -> id
    tool_text_markers: dict[str, str] = field(default_factory=dict)  # role -> text (unit "text")
    channel_markers: dict[str, int] = field(default_factory=dict)  # harmony role -> id
    tool_result: tuple[int, ...] = ()
    tool_result_text: tuple[str, ...] = ()  # tool-result markers that are text in this vocabulary
    # The reasoning state each accepted ending (prompt_suffixes, continuations last) leaves.
    suffix_reasoning: tuple[Reasoning, ...] = ()
    call_stops: tuple[int, ...] = ()  # tool_calls.end_of_turn: the stops of a turn with calls only
    vision: ResolvedVision | None = None  # vision ids and processor settings; None: no images
    # The thinking mode each accepted ending belongs to (True: thinking); one value unless mixed.
    suffix_modes: tuple[bool, ...] = ()
    xtml_markers: dict[str, int] = field(default_factory=dict)  # XTML channel role -> id
    # Markers written as sequences: virtual id (above the vocabulary) -> the real ids. The
    # batch's marker view (`audit.model.tokens.flat_ids.marker_view`) puts these ids in an output's
    # place; every comparison of output ids with marker ids reads that view.
    sequences: dict[int, tuple[int, ...]] = field(default_factory=dict)
    thinking_token: int | None = None  # the id the prompt holds only with thinking on, if any

    def width(self, marker: int) -> int:
        """How many ids the marker takes in an output: its sequence's length, else 1."""
        return len(self.sequences.get(marker, (marker,)))

    def widths(self, markers: np.ndarray) -> np.ndarray:
        """`width` of each of many marker ids."""
        return widths(self.sequences, markers)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def reasonings(self) -> frozenset[str]:
        """Every reasoning state a record of this run may be in (one per kind of ending)."""
        return frozenset(self.suffix_reasoning or (self.reasoning,))

    @property
    def thinks(self) -> bool:
        """Can a record of this run hold reasoning (closed by the response token)?"""
        return bool(self.reasonings & set(THINKING_STATES))

    def prompt_reasoning(self, input_ids: list[int]) -> Reasoning:
        """The reasoning state a prompt leaves its output in: that of the longest accepted
        ending it ends with; the generation prompt's when it ends with none (PRM001's finding)."""
        states = self.suffix_reasoning or (self.reasoning,) * len(self.prompt_suffixes)
        fitting = [
            (len(suffix), state)
            for suffix, state in zip(self.prompt_suffixes, states, strict=True)
            if len(input_ids) >= len(suffix)
            and tuple(input_ids[len(input_ids) - len(suffix) :]) == suffix
        ]
        return max(fitting, key=lambda item: item[0])[1] if fitting else self.reasoning

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that may end a finished output: end of turn first, then EOS."""
        return tuple(dict.fromkeys(self.end_of_turn + self.eos))

    @property
    def marker_ids(self) -> tuple[int, ...]:
        """Every id the profile names in outputs: think, stop, tool-call, tool-result, channels."""
        named = (self.think_start, self.think_end, *self.stop_ids, *self.tool_markers.values(),
                 *self.tool_result, *self.channel_markers.values(), *self.xtml_markers.values())
        return tuple(dict.fromkeys(i for i in named if i is not None))

    @property
    def tool_calls(self) -> ToolCallSpec | None:
        return self.profile.tool_calls

    @property
    def prompt_renderer(self) -> str:
        """How this family's prompts are rendered: a name in `audit.model.rendering.templating.RENDERERS`."""
        return self.profile.encoder or CHAT_TEMPLATE

    @property
    def channels(self) -> ChannelSpec | None:
        return self.profile.channels

    @property
    def think_ids(self) -> tuple[int, int]:
        """The think start and end ids, for what runs only where the family has them."""
        if self.think_start is None or self.think_end is None:
            raise ConfigError(f"profile {self.name} has no think tokens: no reasoning rule applies")
        return self.think_start, self.think_end

    @property
    def channel_spec(self) -> ChannelSpec:
        """The harmony channels, for what runs only where the family has them."""
        if self.profile.channels is None:
            raise ConfigError(f"profile {self.name} has no [channels]: nothing of harmony applies")
        return self.profile.channels

    @property
    def tool_call_spec(self) -> ToolCallSpec:
        """The tool-call markers and format, for what runs only where the family has them."""
        if self.profile.tool_calls is None:
            raise ConfigError(f"profile {self.name} has no [tool_calls]: no tool-call rule applies")
        return self.profile.tool_calls

    @property
    def modes(self) -> tuple[bool, ...]:
        """The single modes of this run, thinking first: one, or both when mixed."""
        return modes_of(self.thinking)

    def ending_modes(self, input_ids: list[int]) -> tuple[bool, ...]:
        """The modes whose endings a prompt ends with (both when the modes share it; none: PRM001's)."""
        modes = self.suffix_modes or (bool(self.thinking),) * len(self.prompt_suffixes)
        return tuple(dict.fromkeys(
            mode for suffix, mode in zip(self.prompt_suffixes, modes, strict=True)
            if len(input_ids) >= len(suffix) and tuple(input_ids[len(input_ids) - len(suffix) :]) == suffix
        ))

    def mode_endings(self, thinking: bool) -> list[int]:
        """The indexes in `prompt_suffixes` of the endings one mode accepts, its generation prompt first."""
        modes = self.suffix_modes or (bool(self.thinking),) * len(self.prompt_suffixes)
        return [index for index, mode in enumerate(modes) if mode == thinking]

    def mode_template_kwargs(self, thinking: bool) -> dict[str, Any]:
        """The template variables that render a prompt in one thinking mode."""
        return self.profile.template_kwargs(thinking)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The template variables that render prompts in this run's thinking mode (a mixed run
        has one set per mode: `mode_template_kwargs`)."""
        if self.thinking == MIXED:
            raise ValueError("a mixed run renders each record in its own mode: use mode_template_kwargs")
        return self.profile.template_kwargs(self.thinking)

    def to_dict(self) -> dict[str, Any]:
        """The resolved tokens, for the report."""
        resolved = {
            "name": self.name,
            "source": str(self.profile.source),
            "thinking": self.thinking,
            "reasoning": self.reasoning,
            "think_start": self.think_start,
            "think_end": self.think_end,
            "end_of_turn": list(self.end_of_turn),
            "eos": list(self.eos),
            "prompt_suffixes": [list(s) for s in self.prompt_suffixes],
            "tool_markers": self.tool_markers,
        }
        optional = {  # each only where it says something
            "suffix_reasoning": list(self.suffix_reasoning) if len(set(self.suffix_reasoning)) > 1 else None,
            "suffix_modes": list(self.suffix_modes) if self.thinking == MIXED else None,
            "tool_text_markers": self.tool_text_markers, "tool_result": list(self.tool_result),
            "tool_result_text": list(self.tool_result_text), "call_stops": list(self.call_stops),
            "channel_markers": self.channel_markers, "xtml_markers": self.xtml_markers,
            "sequences": {str(k): list(v) for k, v in self.sequences.items()},
        }
        return {**resolved, **{key: value for key, value in optional.items() if value}}


def builtin_profiles() -> dict[str, Path]:
    """Built-in profile names and their files."""
    return {path.stem: path for path in sorted(PROFILES_DIR.glob("*.toml"))}


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile TOML file by path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" or path.is_file()):
        known = builtin_profiles()
        if name_or_path not in known:
            raise ConfigError(
                f"unknown profile {name_or_path!r}: use one of {', '.join(known)} "
                "or pass a profile .toml file"
            )
        path = known[name_or_path]
    return parse_profile(load_toml(path), path)


def parse_profile(data: dict[str, Any], source: Path) -> Profile:
    """Build a Profile from parsed TOML, rejecting unknown keys."""
    where = str(source)
    reject_unknown(data, _TOP_KEYS, where)
    tokens = expect(data.get("tokens", {}), dict, f"{where}: [tokens]")
    reject_unknown(tokens, _TOKEN_KEYS, f"{where}: [tokens]")
    prompt = dict(expect(data.get("generation_prompt", {}), dict, f"{where}: [generation_prompt]"))
    reject_unknown(prompt, _PROMPT_KEYS, f"{where}: [generation_prompt]")
    continuations = parse_continuations(prompt.pop("continuation", []), prompt, where)
    renders = expect(prompt.pop("as_template_renders", False), bool, f"{where}: generation_prompt.as_template_renders")
    if "thinking" not in prompt and "no_thinking" not in prompt:
        raise ConfigError(f"{where}: [generation_prompt] needs `thinking` or `no_thinking`")
    pinned = expect(data.get("pinned_ids", {}), dict, f"{where}: [pinned_ids]")
    for text, value in pinned.items():
        expect(value, int, f"{where}: pinned_ids.{text}")
    if "end_of_turn" not in tokens:
        raise ConfigError(f"{where}: [tokens] needs `end_of_turn`")
    end_of_turn = string_list(tokens["end_of_turn"], f"{where}: tokens.end_of_turn")
    if not end_of_turn:
        raise ConfigError(f"{where}: tokens.end_of_turn is empty; name the token that ends a turn")
    # An empty think token would read as "no think tokens" and silently switch the reasoning checks off.
    think, sequences = marker_table(tokens, [k for k in ("think_start", "think_end") if k in tokens], f"{where}: tokens")
    if "thinking_token" in tokens and not (isinstance(tokens["thinking_token"], str) and tokens["thinking_token"]):
        raise ConfigError(f"{where}: tokens.thinking_token: expected a token string, got {tokens['thinking_token']!r}")
    encoder = data.get("encoder")
    if encoder is not None and expect(encoder, str, f"{where}: encoder") not in RENDERERS:
        raise ConfigError(f"{where}: encoder: no prompt encoder {encoder!r} (known: {', '.join(RENDERERS)})")
    eos = string_list(tokens.get("eos", []), f"{where}: tokens.eos")
    tool_calls = parse_tool_calls(data.get("tool_calls"), where)
    if tool_calls is not None:
        check_call_stops(tool_calls, end_of_turn, eos, where)
    xtml = parse_xtml(data.get("xtml"), where)
    sequences.update({**(tool_calls.sequences if tool_calls else {}), **(xtml.sequences if xtml else {})})
    window = expect(tokens.get("think_open_window", 0), int, f"{where}: tokens.think_open_window")
    if window < 0:
        raise ConfigError(f"{where}: tokens.think_open_window: expected 0 or more tokens, got {window}")
    return Profile(
        name=expect(data.get("name", source.stem), str, f"{where}: name"),
        description=expect(data.get("description", ""), str, f"{where}: description"),
        source=source,
        think_start=think.get("think_start"),
        think_end=think.get("think_end"),
        end_of_turn=end_of_turn,
        eos=eos,
        tool_result=string_list(tokens.get("tool_result", []), f"{where}: tokens.tool_result"),
        prompt_suffixes={mode: string_list(value, f"{where}: generation_prompt.{mode}") for mode, value in prompt.items()},
        pinned_ids=dict(pinned),
        tool_calls=tool_calls,
        think_open_window=window,
        thinking_token=tokens.get("thinking_token"),
        as_template_renders=renders,
        channels=parse_channels(data.get("channels"), where),
        encoder=encoder,
        thinking_switch=parse_template(data.get("template"), prompt, where),
        continuations=continuations,
        vision=parse_vision(data.get("vision"), where),
        sequences=sequences,
        xtml=xtml,
    )
