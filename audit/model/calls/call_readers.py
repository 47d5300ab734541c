"""How each family's call text is read: name, call id, arguments, and where it breaks the grammar.

A reader gets the text of one call (`head` between call begin and argument begin, `body` the
rest; all of it in `head` for formats without an argument begin) or, for formats delimited by
text (DSML), a whole answer. It is exact as the family's template: every parameter, argument
pair, invoke and block closed, in order, nothing but whitespace left between the tags. A value
never runs on past the next tag of its own kind: a missing `</parameter>` is a missing closer,
not a value that swallowed the next parameter. Where the text breaks the grammar the call says
how (`malformed`) and where (`problem_at`, a character offset into `head + body`, which the
call reader turns into a token offset).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from audit.model.calls.call_elements import Element


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it, read from its text.

    `arguments` is the arguments' text as the format writes it (JSON for JSON formats);
    `parameters` holds (name, value text) pairs for formats that write each parameter as text,
    judged by the declared types; `elements` the parameters of formats that write arguments as
    nested elements (MiniMax-M3), judged leaf by leaf against the tool's schema, and
    `arguments_error` why they cannot be read at all, when the reader knows it (elements out of
    order); `malformed` says how the call's text breaks the format's grammar, and `problem_at`
    where (a character offset into the reader's `head + body`).
    """

    name: str | None
    call_id: str | None = None
    arguments: str = ""
    parameters: tuple[tuple[str, str], ...] | None = None
    malformed: str | None = None
    elements: tuple[Element, ...] | None = None
    arguments_error: str | None = None
    problem_at: int | None = None
    # Values the model itself marked as strings (DSML's string="true"): judged by whether the
    # declared type admits a string at all, beside `arguments`, which is JSON.
    strings: tuple[tuple[str, str], ...] = ()
    # The call's number as it writes it (Kimi-K3's index="N"), for formats that number calls.
    index: str | None = None
    # With `strings`: every argument's key in the order the model wrote them (the strings and the
    # JSON values of `arguments` are read apart), so the call can be rebuilt as a server returns it.
    order: tuple[str, ...] = ()


# (head, body) -> the calls in that text. For units "call" and "text", head is the text between
# call begin and argument begin (all of it when the format has no argument begin) and body the
# rest; for unit "answer", head is the whole answer and body is empty.
Reader = Callable[[str, str], list[ToolCall]]


def _tag_free(*tags: str) -> str:
    """A regex for text holding none of `tags`: a value that stops before the next tag."""
    return "(?:(?!" + "|".join(re.escape(tag) for tag in tags) + ").)*"


def _first_text(text: str, at: int) -> int:
    """The offset of the first character at or after `at` that is not whitespace."""
    return at + len(text[at:]) - len(text[at:].lstrip())


# -- JSON arguments ---------------------------------------------------------------------------


def kimi_call(head: str, body: str) -> list[ToolCall]:
    # Kimi writes `functions.NAME:IDX` as the call id; the name is inside it.
    call_id = head.strip()
    name = call_id.removeprefix("functions.").rsplit(":", 1)[0] if call_id else None
    return [ToolCall(name=name or None, call_id=call_id, arguments=body)]


def named_call(head: str, body: str) -> list[ToolCall]:
    # DeepSeek V3.1 writes the function name, then the separator, then the JSON arguments.
    return [ToolCall(name=head.strip() or None, arguments=body)]


_FENCED_JSON = re.compile(r"^\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def r1_call(head: str, body: str) -> list[ToolCall]:
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


def qwen3_call(head: str, body: str) -> list[ToolCall]:
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
    try:
        return [ToolCall(name=name, arguments=orjson.dumps(arguments).decode())]
    except orjson.JSONEncodeError:  # orjson reads 1,023 levels of nesting but writes 254
        return [ToolCall(name=name, arguments=head, arguments_error=TOO_DEEP)]


TOO_DEEP = "are nested too deeply to be written again (over 253 levels of arrays and objects)"


# -- parameters as text ------------------------------------------------------------------------

_GLM_TAGS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
# Between the name and the tags GLM's template writes nothing (4.7, 5) or a newline (4.5);
# GLM-4.6 also writes the two characters `\n` there, which SGLang's glm4_moe_detector reads as
# that newline (its tests keep such output as real model output): both are a separator.
_GLM_GAP = r"(?:\s|\\n)*"
_GLM_PAIR = re.compile(
    rf"{_GLM_GAP}<arg_key>({_tag_free(*_GLM_TAGS)})</arg_key>{_GLM_GAP}<arg_value>({_tag_free(*_GLM_TAGS)})</arg_value>",
    re.DOTALL,
)
_GLM_TRAILING_GAP = re.compile(rf"{_GLM_GAP}$")


def glm_call(head: str, body: str) -> list[ToolCall]:
    """GLM (chat_template.jinja): NAME (4.5: and a newline), then per argument
    `<arg_key>k</arg_key><arg_value>v</arg_value>` (4.5: a newline after each tag), nothing else.
    Values are text: the template writes strings raw and other values as JSON, and SGLang's GLM
    detectors convert them by the declared type (glm4_moe_detector.py). An object or array the
    model wrote as escaped JSON (`[{\\"id\\": 1}]`) is read as SGLang's GLM `parse_arguments`
    reads it, unescaped once as the body of a JSON string (`_glm_value`)."""
    start = head.find("<arg_key>")
    name = head if start < 0 else head[:start]
    pairs: list[tuple[str, str]] = []
    at = len(name)
    while pair := _GLM_PAIR.match(head, at):
        pairs.append((pair.group(1).strip(), _glm_value(pair.group(2))))
        at = pair.end()
    malformed = problem_at = None
    if not _GLM_TRAILING_GAP.match(head, at):
        problem_at = _first_text(head, at)
        malformed = f"text where <arg_key>k</arg_key><arg_value>v</arg_value> belongs: {head[problem_at:][:40]!r}"
    written = _GLM_TRAILING_GAP.sub("", name).strip()
    return [
        ToolCall(
            name=written or None, arguments=head[len(name) :], parameters=tuple(pairs),
            malformed=malformed, problem_at=problem_at,
        )
    ]


def _glm_value(value: str) -> str:
    """A GLM argument value as SGLang's GLM detectors read it: as written, or, where it is not
    JSON but reads as a JSON object or array once unescaped as the body of a JSON string (the
    model's escaped quotes, `[{\\"id\\": \\"1\\"}]`), that unescaped JSON."""
    if '\\"' not in value:
        return value
    try:
        orjson.loads(value)
        return value
    except orjson.JSONDecodeError:
        pass
    try:
        unescaped = orjson.loads(f'"{value.strip()}"')
        parsed = orjson.loads(unescaped)
    except orjson.JSONDecodeError:
        return value
    return unescaped if isinstance(parsed, dict | list) else value


_QWEN_FUNCTION = re.compile(rf"\s*<function=([^>\n]*)>({_tag_free('<function=', '</function>')})</function>", re.DOTALL)
_QWEN_PARAMETER = re.compile(
    rf"\s*<parameter=([^>\n]*)>({_tag_free('<parameter=', '</parameter>', '</function>')})</parameter>", re.DOTALL
)


def qwen_xml_call(head: str, body: str) -> list[ToolCall]:
    """Qwen3.5/3.6 (chat_template.jinja): `<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n
    </parameter>\\n</function>\\n</tool_call>`. The value is the text between the parameter
    tags with one leading and one trailing newline removed, as SGLang's qwen3_coder_detector
    reads it; it never holds the next `<parameter=`: the template closes every parameter."""
    calls: list[ToolCall] = []
    at = 0
    while function := _QWEN_FUNCTION.match(head, at):
        name, inner, inner_start = function.group(1).strip(), function.group(2), function.start(2)
        pairs: list[tuple[str, str]] = []
        inner_at = 0
        while parameter := _QWEN_PARAMETER.match(inner, inner_at):
            pairs.append((parameter.group(1).strip(), parameter.group(2).removeprefix("\n").removesuffix("\n")))
            inner_at = parameter.end()
        malformed = problem_at = None
        if inner[inner_at:].strip():
            offset = _first_text(inner, inner_at)
            problem_at = inner_start + offset
            if inner.startswith("<parameter=", offset):
                key = inner[offset + len("<parameter=") :].split(">", 1)[0][:40]
                malformed = f"<parameter={key}> is not closed by </parameter> in function {name or '?'}"
            else:
                malformed = f"text outside <parameter=K>...</parameter> in function {name or '?'}: {inner[offset:][:40]!r}"
        calls.append(ToolCall(name=name or None, arguments=inner, parameters=tuple(pairs), malformed=malformed,
                              problem_at=problem_at))
        at = function.end()
    if calls and not head[at:].strip():
        return calls
    problem_at = _first_text(head, at)
    rest = head[problem_at:]
    if rest.startswith("<function=") and "</function>" not in rest.split("<function=", 2)[1]:
        problem = f"{rest.split('>', 1)[0][:40]}> is not closed by </function>"
    else:
        problem = f"call text is not <function=NAME> <parameter=K>V</parameter>... </function>: {rest.strip()[:60]!r}"
    return [*calls, ToolCall(name=calls[0].name if calls else None, arguments=head, malformed=problem, problem_at=problem_at)]


def dsml_reader(block: str) -> Reader:
    """DeepSeek-V3.2 (`function_calls`) and V4 (`tool_calls`) DSML blocks in an answer.

    `<｜DSML｜BLOCK>` then `<｜DSML｜invoke name="NAME">` elements holding
    `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` (string="true": raw
    text; "false": JSON), as SGLang's deepseekv32_detector / deepseekv4_detector read them.
    Only `｜DSML｜` is one token id: the tags around it are text.
    """
    dsml = "｜DSML｜"
    opening, closing = f"<{dsml}{block}>", f"</{dsml}{block}>"
    section = re.compile(rf"{re.escape(opening)}(.*?)({re.escape(closing)}|$)", re.DOTALL)
    invoke_tags = (f"<{dsml}invoke", f"</{dsml}invoke>")
    invoke = re.compile(
        rf'\s*<{dsml}invoke\s+name="([^"]*)"\s*(?:/>|>({_tag_free(*invoke_tags)})</{dsml}invoke>)', re.DOTALL
    )
    parameter_tags = (f"<{dsml}parameter", f"</{dsml}parameter>", f"</{dsml}invoke>")
    parameter = re.compile(
        rf'\s*<{dsml}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>({_tag_free(*parameter_tags)})'
        rf"</{dsml}parameter>",
        re.DOTALL,
    )

    def read(head: str, body: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        found = section.search(head)
        if found is None:
            at = head.find(dsml)
            return [ToolCall(name=None, arguments=head, malformed=f"a {dsml} tag outside a {opening} block",
                             problem_at=max(at - 1, 0))]
        inner, inner_start = found.group(1), found.start(1)
        problem, problem_at = None, None
        if not found.group(2):
            problem, problem_at = f"{opening} is never closed", len(head)
        elif head[found.end() :].strip():
            problem_at = _first_text(head, found.end())
            problem = f"text after {closing}: {head[problem_at:][:40]!r}"
        at = 0
        while call := invoke.match(inner, at):
            text, text_start = call.group(2) or "", inner_start + (call.start(2) if call.group(2) else call.end())
            pairs: list[tuple[str, str]] = []
            json_values: dict[str, str] = {}
            order: list[str] = []
            inner_at = 0
            while item := parameter.match(text, inner_at):
                order.append(item.group(1))
                if item.group(2) == "true":
                    pairs.append((item.group(1), item.group(3)))
                else:
                    json_values[item.group(1)] = item.group(3)
                inner_at = item.end()
            malformed = malformed_at = None
            if text[inner_at:].strip():
                offset = _first_text(text, inner_at)
                malformed_at = text_start + offset
                if text.startswith(f"<{dsml}parameter", offset):
                    malformed = f"a <{dsml}parameter> is not closed by </{dsml}parameter>"
                else:
                    malformed = f"text outside the parameter tags: {text[offset:][:40]!r}"
            # string="false" values are JSON: joined into one object the JSON check judges.
            arguments = "{" + ", ".join(f"{orjson.dumps(k).decode()}: {v}" for k, v in json_values.items()) + "}"
            calls.append(ToolCall(name=call.group(1).strip() or None, arguments=arguments, malformed=malformed,
                                  problem_at=malformed_at, strings=tuple(pairs), order=tuple(order)))
            at = call.end()
        if inner[at:].strip():
            offset = _first_text(inner, at)
            if problem is None or inner_start + offset < (problem_at or 0):
                problem_at = inner_start + offset
                problem = (
                    f"a <{dsml}invoke> is not closed by </{dsml}invoke>"
                    if inner.startswith(f"<{dsml}invoke", offset)
                    else f"text inside {opening} that is not an invoke: {inner[offset:][:40]!r}"
                )
        if problem or not calls:
            calls.append(ToolCall(name=None, arguments=inner, malformed=problem or f"an empty {opening} block",
                                  problem_at=problem_at if problem else inner_start))
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


# Deeper than JSON's writer goes (`TOO_DEEP`), and than Python's recursion limit lets the
# element checks walk.
MAX_ELEMENT_DEPTH = 253


class _Malformed(ValueError):
    """Elements out of the format, and how."""


def minimax_call(head: str, body: str) -> list[ToolCall]:
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
        except _Malformed as broken:
            elements, unreadable = (), f"do not read as elements ({broken})"
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
            if len(stack) > MAX_ELEMENT_DEPTH:  # the checks that walk the elements recurse
                raise _Malformed(f"elements nested more than {MAX_ELEMENT_DEPTH} levels deep")
            close = piece.index(">")
            stack.append((piece[1:close].strip(), piece[close + 1 :], []))
        else:
            raise _Malformed(f"text outside the elements: {piece[:40]!r}")
    if len(stack) > 1:
        raise _Malformed(f"<{stack[-1][0]}> is never closed")
    return tuple(stack[0][2])

