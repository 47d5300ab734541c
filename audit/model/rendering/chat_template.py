"""A tokenizer's chat template rendered as transformers renders it, without importing transformers.

Importing transformers costs more than half a second, more than everything else a small audit
does, and re-rendering prompts (TPL001) is the only thing an audit of a plain `tokenizer.json`
needs it for. `ChatTemplate` renders the way transformers' `apply_chat_template(...,
tokenize=False)` does for the inputs an audit has (JSON messages and tool schemas, keyword
switches): the template chosen by the same rule (`tool_use` when tools are given and the
tokenizer has one, else `default`), messages with `None` values dropped, reasoning fields
aliased, the special tokens passed as variables, and the same sandboxed jinja environment
(trim_blocks, lstrip_blocks, loop controls, `{% generation %}`, `tojson` without HTML
escaping, `raise_exception`, `strftime_now`, a restricted `dict` and `namespace`).

It is a second implementation, so it is used only where it was shown to agree:
`audit.model.tokens.tokenizer` renders a set of probe conversations both ways when it first loads a
tokenizer through transformers, and uses this renderer for that tokenizer only if every probe
gave the same text (or the same error). A tokenizer whose class overrides the template methods
(remote code) always renders through transformers, and so does any conversation this renderer
refuses: its error is reported as transformers words it. The tests compare both renderers on
every family's real template. `AUDIT_TOKENIZER_BACKEND=tokenizers` renders through
transformers only.
"""

from __future__ import annotations

import builtins
import json
import types
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

# Names a message's reasoning is passed under; the first is the one templates read.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# Conversations rendered both ways before this renderer is trusted with a tokenizer: plain,
# multi-turn with reasoning, tool calls (arguments as an object and as a string) and results,
# each with thinking on and off.
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]
_PROBES: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "Hello! What is 2 + 2?"}], None),
    (
        [
            {"role": "system", "content": "You are a careful assistant. Übermäßig höflich 🙂"},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7", "reasoning_content": "Small primes: 2, 3, 5, 7."},
            {"role": "user", "content": "Another one, please."},
        ],
        None,
    ),
    (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "functions.get_weather:0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 21}'},
            {"role": "user", "content": "And in Oslo?"},
        ],
        _PROBE_TOOLS,
    ),
    (
        [
            {"role": "user", "content": "Weather in Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        ],
        _PROBE_TOOLS,
    ),
]


class ChatTemplate:
    """A tokenizer's chat template(s) and special-token variables, rendered as transformers does."""

    def __init__(self, templates: str | dict[str, str], special_tokens: dict[str, str]):
        self.templates = templates
        self.special_tokens = dict(special_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"templates": self.templates, "special_tokens": self.special_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatTemplate:
        return cls(data["templates"], data["special_tokens"])

    def _choose(self, tools: list[Any] | None) -> str:
        if not isinstance(self.templates, dict):
            return self.templates
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise ValueError(
            "This model has multiple chat templates with no default specified! Please either pass a chat "
            "template or the name of the template you wish to use to the `chat_template` argument. Available "
            f"template names are {sorted(self.templates.keys())}."
        )

    def render(
        self, messages: list[Any], tools: list[Any] | None = None, *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The template's rendering of one conversation (JSON values), as text.

        Raises what the template raises; inputs transformers would treat differently (a batch
        of conversations, messages that are not objects, tools that are not schemas) raise
        `UnsupportedInput`, for the caller to render them through transformers instead.
        """
        if _RESERVED.intersection(kwargs):
            raise UnsupportedInput("template variables named like apply_chat_template's own arguments")
        template = self._choose(tools)
        if not isinstance(messages, list) or not messages:
            raise UnsupportedInput("an empty or non-list conversation")
        if not all(isinstance(message, dict) for message in messages):
            raise UnsupportedInput("messages that are not objects")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise UnsupportedInput("tools that are not a list of JSON schemas")
        # Keys whose value is None are dropped; reasoning is offered under every name templates read.
        chat = []
        for message in messages:
            message = {key: value for key, value in message.items() if value is not None}
            reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        variables = {**self.special_tokens, **kwargs}
        return _render(
            _compiled(template),
            dict(messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables),
        )


# apply_chat_template's and its renderer's own argument names: a template variable spelled like
# one of them changes what transformers does (`tokenize`, `documents`...), so it renders those.
_RESERVED = frozenset(
    {
        "conversation", "conversations", "messages", "tools", "documents", "chat_template",
        "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
        "padding", "truncation", "max_length", "return_tensors", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)


class UnsupportedInput(ValueError):
    """An input this renderer leaves to transformers."""


# The thinking switch as the template rule passes it (families spell it differently).
PROBE_KWARGS = [{"thinking": True, "enable_thinking": True}, {"thinking": False, "enable_thinking": False}]


def renders_like(template: ChatTemplate, reference: Any) -> bool:
    """Whether `template` renders every probe conversation as `reference(messages, tools, **kw)` does
    (the same text, or an error of the same type and message)."""
    for messages, tools in _PROBES:
        for kwargs in PROBE_KWARGS:
            ours = _outcome(lambda: template.render(messages, tools, **kwargs))  # noqa: B023
            theirs = _outcome(lambda: reference(messages, tools, **kwargs))  # noqa: B023
            if ours != theirs:
                return False
    return True


def _outcome(render: Any) -> tuple[str, str]:
    try:
        return ("text", render())
    except Exception as exc:  # jinja raises many types; compared by type and message
        return (type(exc).__name__, str(exc))


# The types a conversation's JSON values have inside a template.
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
# What the sandbox wraps when a template reaches it (jinja2.sandbox `wrap_str_format`).
_METHOD_TYPES = (types.MethodType, types.BuiltinMethodType)
_FORMAT_METHODS = ("format", "format_map")


def _render(compiled: Any, variables: dict[str, Any]) -> str:
    """`compiled.render(**variables)`, without building the template's globals afresh each time.

    jinja's `Template.render` copies the environment's globals (a ChainMap) into every
    context: ~a quarter of a short render. Those globals never change once the template is
    compiled (`_compiled`), so their dict and key set are made once; the context, the render
    and the errors are jinja's own, as `render` makes them."""
    environment = compiled.environment
    template_globals, global_names = _globals_of(compiled)
    context = environment.context_class(environment, {**template_globals, **variables}, compiled.name, compiled.blocks)
    context.globals_keys = global_names  # (only read: jinja hands it on to derived contexts)
    try:
        return str(environment.concat(compiled.root_render_func(context)))
    except Exception:
        environment.handle_exception()
        raise  # (handle_exception always raises)


@lru_cache(maxsize=8)
def _globals_of(compiled: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """The compiled template's globals, and their names."""
    return dict(compiled.globals), frozenset(compiled.globals)


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """The template compiled in transformers' sandboxed environment (see the module docstring)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for masks; rendering
        # only emits its body.
        tags = {"generation"}

        def parse(self, parser: Any) -> jinja2.nodes.CallBlock:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            block = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
            block.set_lineno(lineno)
            return block

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute."
                )

    class Environment(ImmutableSandboxedEnvironment):
        # Whether an attribute is safe depends only on the object's type and the attribute's
        # name (jinja2.sandbox: `is_internal_attribute`, `modifies_known_mutable`); templates ask
        # about the same namespace variables and methods of JSON values thousands of times a
        # block, so the answer for those types is kept.
        _known_safe: ClassVar[dict[tuple[type, str], bool]] = {}

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            kind = type(obj)
            if kind not in _JSON_TYPES and kind is not TemplateNamespace:
                return super().is_safe_attribute(obj, attr, value)
            key = (kind, attr)
            known = self._known_safe.get(key)
            if known is None:
                known = self._known_safe[key] = super().is_safe_attribute(obj, attr, value)
            return known

        def getattr(self, obj: Any, attribute: str) -> Any:
            # The sandbox's own answer, reached sooner for an attribute of a JSON value or a
            # namespace already known safe: the value itself, unless it is a `str.format` the
            # sandbox would wrap (then, and for anything else, the sandbox's own path).
            kind = type(obj)
            if (kind in _JSON_TYPES or kind is TemplateNamespace) and self._known_safe.get((kind, attribute)):
                try:
                    value = builtins.getattr(obj, attribute)
                except AttributeError:
                    return super().getattr(obj, attribute)
                if not isinstance(value, _METHOD_TYPES) or value.__name__ not in _FORMAT_METHODS:
                    return value
            return super().getattr(obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            # A method of a JSON value (`.strip()`, `.items()`...) is always safely callable (no
            # `unsafe_callable`, no `alters_data`: the sandbox's test, asked of a builtin method).
            if type(__obj) is types.BuiltinMethodType and type(__obj.__self__) in _JSON_TYPES:
                return __context.call(__obj, *args, **kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    environment = Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment.from_string(template)


def verified_chat_template(hf: Any) -> ChatTemplate | None:
    """`hf`'s chat template as a `ChatTemplate`, if it renders the probe conversations exactly as
    `hf.apply_chat_template` does; None for a class that renders its own way (remote code)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    cls = type(hf)
    for name in ("apply_chat_template", "get_chat_template", "special_tokens_map"):
        if getattr(cls, name, None) is not getattr(PreTrainedTokenizerBase, name, None):
            return None
    templates = hf.chat_template
    special = hf.special_tokens_map
    if not (isinstance(templates, str) or (isinstance(templates, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in templates.items()))):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in special.items()):
        return None
    template = ChatTemplate(templates, special)

    def reference(messages: list[Any], tools: list[Any] | None, **kwargs: Any) -> str:
        return hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)

    return template if renders_like(template, reference) else None
