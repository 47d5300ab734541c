"""The thinking modes a run audits, and the prompt endings each accepts with the reasoning
state it leaves.

A run audits one mode (`True`: thinking on, `False`: off) or both at once (`"mixed"`): a
partition of a model served in both modes holds prompts of each, and every record is judged in
the mode its own prompt ending shows (`ResolvedProfile.suffix_modes`). The endings of a mixed
run are those of thinking, then those of no_thinking, each with its reasoning state: the same
as each single-mode run accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from audit.base.errors import ConfigError
from audit.model.families.profile_tables import Continuation, check_continuation
from audit.model.families.prompt_endings import Reasoning, reasoning_left, suffix_ids
from audit.model.tokens.flat_ids import view_of
from audit.model.tokens.tokenizer import Tokenizer

MIXED: Literal["mixed"] = "mixed"
# A run's thinking mode: on (True), off (False), or both, each record in its prompt's (MIXED).
ThinkingMode = bool | Literal["mixed"]


def mode_key(thinking: bool) -> str:
    """The profile's name of a single mode: `thinking` or `no_thinking`."""
    return "thinking" if thinking else "no_thinking"


def mode_label(thinking: ThinkingMode) -> str:
    """How people read a run's mode: `on`, `off` or `mixed`."""
    return MIXED if thinking == MIXED else ("on" if thinking else "off")


def modes_of(thinking: ThinkingMode) -> tuple[bool, ...]:
    """The single modes a run audits, thinking first."""
    return (True, False) if thinking == MIXED else (bool(thinking),)


def flag_mode(flag: str) -> ThinkingMode:
    """The mode `--thinking on|off|mixed` names."""
    return MIXED if flag == MIXED else flag == "on"


def parse_thinking(value: Any, where: str) -> ThinkingMode | None:
    """A thinking mode as a file or a caller gives it: true, false, "mixed" or none; ConfigError else."""
    if value is None or isinstance(value, bool) or value == MIXED:
        return value
    raise ConfigError(f"{where}: thinking must be true, false or \"mixed\", got {value!r}")


@dataclass(frozen=True)
class Endings:
    """The prompt endings a run accepts, in order (per mode: its generation prompts, then its
    continuations), each with its reasoning state and its mode."""

    texts: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]
    states: tuple[Reasoning, ...]
    modes: tuple[bool, ...]
    reasoning: Reasoning  # the state the first generation prompt leaves


def resolve_endings(
    suffixes: dict[str, tuple[str, ...]],
    continuations: tuple[Continuation, ...],
    tokenizer: Tokenizer,
    thinking: ThinkingMode,
    think_start: int | None,
    think_end: int | None,
    where: str,
    sequences: dict[int, tuple[int, ...]] | None = None,
    *,
    mode_by_token: bool = False,
) -> Endings:
    """The endings of each mode of the run, resolved to ids; ConfigError on a mode the family
    lacks, an empty suffix, or one ending two modes would judge in different states (unless
    `mode_by_token`: the prompt's thinking token says each record's mode, not its ending)."""
    texts: list[str] = []
    ids: list[tuple[int, ...]] = []
    states: list[Reasoning] = []
    modes: list[bool] = []
    for mode in modes_of(thinking):
        for text, ending, state, rendered in _mode_endings(
            suffixes, continuations, tokenizer, mode, think_start, think_end, where, sequences or {}
        ):
            texts.append(text)
            ids.append(ending)
            states.append(state)
            modes.append(rendered)
    for index, ending in enumerate(ids):
        if mode_by_token:
            break
        other = next((i for i in range(index) if ids[i] == ending and states[i] != states[index]), None)
        if other is not None:
            raise ConfigError(
                f"{where}: ending {texts[index]!r} leaves reasoning {states[other]!r} with thinking "
                f"and {states[index]!r} without: a record ending so cannot be judged in a mixed run; "
                "audit each mode's records apart (--thinking on, --thinking off)"
            )
    return Endings(tuple(texts), tuple(ids), tuple(states), tuple(modes), states[0])


def _mode_endings(
    suffixes: dict[str, tuple[str, ...]],
    continuations: tuple[Continuation, ...],
    tokenizer: Tokenizer,
    thinking: bool,
    think_start: int | None,
    think_end: int | None,
    where: str,
    sequences: dict[int, tuple[int, ...]],
) -> list[tuple[str, tuple[int, ...], Reasoning, bool]]:
    """One mode's endings: its generation prompts (all in one state), then its continuations;
    each with the mode it was rendered in (the mode's, or the continuation's `rendered`)."""
    mode = mode_key(thinking)
    suffix_texts = suffixes.get(mode)
    if not suffix_texts:
        other = "on" if mode == "no_thinking" else "off"
        raise ConfigError(
            f"{where}: has no generation_prompt.{mode}; this family has no such mode: audit its data "
            f"with --thinking {other}"
        )

    def ids_of(text: str, key: str) -> tuple[int, ...]:
        if not text:
            raise ConfigError(
                f"{where}: {key} has an empty suffix; give the text the chat template "
                "appends to open the assistant turn"
            )
        ids = suffix_ids(tokenizer, text)
        if not ids:
            raise ConfigError(
                f"{where}: {key} {text!r} has no ids of its own (it merges with whatever "
                "precedes it); give the text the chat template appends to open the turn"
            )
        return ids

    found = [(text, ids_of(text, f"generation_prompt.{mode}")) for text in suffix_texts]
    # The think markers are looked for in the endings' marker views (a marker may be a sequence).
    reasoning = reasoning_left(view_of(found[0][1], sequences), think_start, think_end, thinking)
    for text, ids in found[1:]:
        if reasoning_left(view_of(ids, sequences), think_start, think_end, thinking) != reasoning:
            raise ConfigError(
                f"{where}: generation_prompt.{mode} suffix {text!r} leaves reasoning in a "
                "different state than the first one; list such variants in separate "
                "profiles, or as a [[generation_prompt.continuation]] that says its state"
            )
    endings = [(text, ids, reasoning, thinking) for text, ids in found]
    for continuation in continuations:
        if mode not in continuation.modes:
            continue
        key = "generation_prompt.continuation.suffix"
        ids = ids_of(continuation.suffix, key)
        check_continuation(continuation, view_of(ids, sequences), think_start, think_end, thinking, f"{where}: {key}")
        rendered = thinking if continuation.rendered is None else continuation.rendered == "thinking"
        endings.append((continuation.suffix, ids, continuation.reasoning, rendered))
    return endings
