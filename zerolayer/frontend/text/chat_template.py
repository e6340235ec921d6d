"""The model's chat template: chat messages rendered into a prompt, as transformers does it.

Source of the template: ``chat_template.jinja`` of the model directory when it exists, else
``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{name, template}`` of
which the one named ``default`` is used), as transformers' ``PreTrainedTokenizerBase`` loads it.

Rendering follows transformers' ``apply_chat_template`` (``render_jinja_template``,
``_compile_jinja_template`` in ``transformers/utils/chat_template_utils.py``, v5): a jinja2
``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols``
extension and the ``generation`` tag (rendered as its body); a ``tojson`` filter that does not
escape HTML; the globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``
(refusing underscore attributes); the variables ``messages``,
``tools`` (None without tools), ``documents`` (None), ``add_generation_prompt``, the special
tokens of tokenizer_config.json (``bos_token``, ``eos_token``...) and the caller's further
variables (``chat_template_kwargs``: ``enable_thinking``...), which win over the special tokens
as transformers' ``**kwargs`` do. The messages and tools take the shapes of
:mod:`zerolayer.frontend.text.chat_variables`. The rendered text is tokenized without
adding special tokens again (the template writes BOS itself), as ``apply_chat_template(...,
tokenize=True)`` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox
import jinja2.utils

from zerolayer.checkpoints.tokenizer_files import parse_tokenizer_config
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage, ToolDefinition
from zerolayer.frontend.text.chat_variables import message_dict, tool_dict
from zerolayer.frontend.text.tokenizer import special_token_content

CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat message may have."""
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""tokenizer_config.json's named special tokens, which templates see as variables (transformers'
``SPECIAL_TOKENS_ATTRIBUTES``)."""


class ChatTemplate:
    """A compiled chat template and the special tokens it renders with.

    A template jinja2 cannot compile is kept, with its error: each render then fails with that
    error (the model serves prompts anyway).
    """

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        """Use :meth:`from_model_files`.

        Args:
            source: the template's jinja2 text.
            special_tokens: variable name (``bos_token``...) to the token's text.
        """
        self.source = source
        self.special_tokens = dict(special_tokens)
        self._template: jinja2.Template | None = None
        self._error = ""
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            self._error = _describe(exc)

    @classmethod
    def from_model_files(
        cls, tokenizer_config_json: str, chat_template_jinja: str = ""
    ) -> ChatTemplate | None:
        """The model's chat template, or None when it has none.

        Args:
            tokenizer_config_json: text of tokenizer_config.json ("" when absent).
            chat_template_jinja: text of chat_template.jinja ("" when absent); wins over the
                config's ``chat_template``.

        Raises:
            ValueError: tokenizer_config.json is not JSON or not a JSON object, or its
                ``chat_template`` is neither a string nor a list of ``{name, template}``.
        """
        config = parse_tokenizer_config(tokenizer_config_json)
        source = chat_template_jinja or _config_template(config.get("chat_template"))
        if not source:
            return None
        special_tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            token = special_token_content(config.get(name))
            if token is not None:
                special_tokens[name] = token
        return cls(source, special_tokens)

    def render(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool,
        tools: Sequence[ToolDefinition] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages``.

        Args:
            tools: the template's ``tools`` (None when empty).
            template_kwargs: further template variables
                (:func:`zerolayer.frontend.text.chat_variables.template_kwargs`).

        Raises:
            InvalidArgument: ``messages``: the template does not compile, or fails while rendering
                (its ``raise_exception`` included); the message is jinja2's.
        """
        if self._template is None:
            raise InvalidArgument(
                "messages", f"the model's chat template is invalid: {self._error}"
            )
        variables = {**self.special_tokens, **(template_kwargs or {})}
        try:
            return self._template.render(
                messages=[message_dict(m) for m in messages],
                tools=[tool_dict(t) for t in tools] if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as exc:
            raise InvalidArgument(
                "messages", f"the model's chat template failed: {_describe(exc)}"
            ) from exc


def check_messages(messages: Sequence[ChatMessage]) -> None:
    """Refuses an empty conversation, a message of an unknown role, tool calls on a message that
    is not the assistant's and, in a conversation with tool calls, a tool message that answers
    no earlier call.

    Raises:
        InvalidArgument: ``messages`` (empty), ``messages[i].role``, ``messages[i].tool_calls``
            or ``messages[i].tool_call_id``.
    """
    if not messages:
        raise InvalidArgument("messages", "empty (set at least one message)")
    with_calls = any(m.tool_calls for m in messages)
    called: set[str] = set()
    for i, message in enumerate(messages):
        if message.role not in CHAT_ROLES:
            raise InvalidArgument(
                f"messages[{i}].role",
                f"must be one of {', '.join(CHAT_ROLES)}, got {message.role[:64]!r}",
            )
        if message.tool_calls and message.role != "assistant":
            raise InvalidArgument(f"messages[{i}].tool_calls", "only assistant messages call tools")
        called.update(call.id for call in message.tool_calls)
        if with_calls and message.role == "tool" and message.tool_call_id not in called:
            raise InvalidArgument(
                f"messages[{i}].tool_call_id",
                f"{message.tool_call_id[:64]!r} answers no earlier assistant message's tool call",
            )


def _config_template(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in value
    ):
        named = {t["name"]: t.get("template") for t in value}
        template = named.get("default", "")
        if not isinstance(template, str):
            raise ValueError("tokenizer_config_json: chat_template 'default' must be a string")
        return template
    raise ValueError(
        "tokenizer_config_json: chat_template must be a string or a list of {name, template}"
    )


def _describe(exc: jinja2.TemplateError) -> str:
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"{exc.message} (line {exc.lineno})"
    return str(exc)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # NOTE: jinja2's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (transformers marks assistant
    tokens with it; zerolayer only needs the text)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _TemplateDict:
    """``dict`` for templates: callable, without attributes to escape through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's ``namespace`` refusing underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
