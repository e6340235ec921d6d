"""Anthropic request bodies (``zerolayer.frontend.anthropic.schema``) to the chat the model's
template renders (:class:`Conversation`) and to :class:`GenerateParams`.

How Anthropic's shape maps onto a chat template's messages (transformers' semantics, as the
OpenAI chat API passes them): ``system`` becomes a first ``system`` message; an assistant message
becomes one ``assistant`` message (its text blocks, its ``thinking`` blocks as
``reasoning_content``, its ``tool_use`` blocks as ``tool_calls``); a user message becomes, in
block order, one ``tool`` message per ``tool_result`` block (``tool_call_id``: its
``tool_use_id``; ``name``: the tool called) and one ``user`` message per run of text blocks.
Text blocks of one message (and of ``system``) are joined with a newline. ``cache_control``
breakpoints become ``cache_pins`` (``zerolayer.frontend.anthropic.breakpoints``, which says
where each one lies in the translated chat). What validation checks
(the model, ranges, the context) is left to ``zerolayer.frontend.text.validation``; errors here
name the field as Anthropic does (``messages.1.content.0.tool_use_id``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    CachePin,
    ChatMessage,
    GenerateParams,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from zerolayer.frontend.anthropic.breakpoints import (
    Breakpoint,
    block_breakpoint,
    joined_length,
    request_pins,
)
from zerolayer.frontend.anthropic.schema import (
    BLOCKS,
    CountTokensRequest,
    MessageIn,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

ANTHROPIC_DEFAULT_TEMPERATURE = 1.0
"""Temperature of a request that leaves it unset (Anthropic's default; gRPC's is greedy)."""
TOOL_CHOICE_MODES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}
"""The seam's ToolChoice.mode of Anthropic's ``tool_choice.type``."""
UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
"""Names pydantic gives the members of a union in an error's location."""


@dataclass(frozen=True)
class Conversation:
    """What a Messages request asks the chat template to render."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    enable_thinking: bool | None = None
    """``thinking.type`` (``disabled``: False, any other: True); None: not said."""
    cache_pins: tuple[CachePin, ...] = ()
    """The prefixes its ``cache_control`` breakpoints ask to keep cached."""


def conversation(body: CountTokensRequest) -> Conversation:
    """The chat of ``body`` (see the module docstring).

    Raises:
        InvalidArgument: ``output_config`` or ``container`` (not implemented), a content block
            of an unknown type or that is not valid, one in a role that cannot send it, a
            ``tool_result`` whose ``tool_use_id`` no earlier ``tool_use`` has, tool blocks
            without ``tools``, two tools of one name, a ``tool_choice`` naming no tool, a last
            message from the assistant (prefill is not supported); ``cache_control`` that
            Anthropic refuses (see ``zerolayer.frontend.anthropic.breakpoints.cache_pins``).
    """
    for field in ("output_config", "container"):
        if getattr(body, field, None) is not None:
            raise InvalidArgument(field, "not supported")
    tools = tuple(
        ToolDefinition(t.name, t.description, json.dumps(t.input_schema)) for t in body.tools or ()
    )
    names = [t.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidArgument(f"tools.{i}.name", f"{name!r}: two tools of this name")
    messages, used_tools, breakpoints = _messages(body)
    pins = request_pins(body, messages, breakpoints)
    if used_tools and not tools:
        raise InvalidArgument("tools", "tool_use and tool_result blocks need tools defined")
    if body.messages[-1].role == "assistant":
        field = f"messages.{len(body.messages) - 1}"
        raise InvalidArgument(field, "a last assistant message (prefill) is not supported")
    thinking = None if body.thinking is None else body.thinking.type != "disabled"
    choice = body.tool_choice
    if choice is None:
        return Conversation(messages, tools, enable_thinking=thinking, cache_pins=pins)
    if choice.type != "none" and not tools:
        raise InvalidArgument("tool_choice", f"{choice.type!r} needs tools")
    if choice.type == "tool" and choice.name not in names:
        raise InvalidArgument("tool_choice.name", f"{choice.name!r} is not one of the tools")
    mode = TOOL_CHOICE_MODES[choice.type]
    tool_choice = ToolChoice(mode, choice.name if mode == "function" else "")
    return Conversation(
        messages, tools, tool_choice, not choice.disable_parallel_tool_use, thinking, pins
    )


def generate_params(body: MessagesRequest, request_id: str) -> GenerateParams:
    """The generation a ``/v1/messages`` body asks for.

    Raises:
        InvalidArgument: see :func:`conversation`; ``tools`` (not in this build yet).
    """
    chat = conversation(body)
    temperature = ANTHROPIC_DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    return GenerateParams(
        messages=chat.messages,
        **seam_fields(chat),
        model=body.model,
        request_id=request_id,
        max_new_tokens=body.max_tokens,
        temperature=temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=tuple(body.stop_sequences or ()),
        cache_pins=chat.cache_pins,
    )


def count_params(body: CountTokensRequest) -> GenerateParams:
    """A generation of ``body``'s prompt, whose prompt tokens are what count_tokens counts
    (its ``cache_control`` checked as :func:`generate_params` checks it, and not pinned).

    Raises:
        InvalidArgument: see :func:`generate_params`.
    """
    chat = conversation(body)
    return GenerateParams(
        messages=chat.messages,
        **seam_fields(chat),
        model=body.model,
    )


def seam_fields(chat: Conversation) -> dict[str, Any]:
    """The GenerateParams fields of the seam that ``chat`` sets, by name: ``tools``,
    ``tool_choice``, ``parallel_tool_calls``, ``chat_template_kwargs_json`` (``enable_thinking``
    when ``thinking`` was sent) and ``parse_output`` (always: the answer's thought and calls
    come back apart)."""
    kwargs = {} if chat.enable_thinking is None else {"enable_thinking": chat.enable_thinking}
    return {
        "tools": chat.tools,
        "tool_choice": chat.tool_choice,
        "parallel_tool_calls": chat.parallel_tool_calls,
        "chat_template_kwargs_json": json.dumps(kwargs) if kwargs else "",
        "parse_output": True,
    }


def _messages(
    body: CountTokensRequest,
) -> tuple[tuple[ChatMessage, ...], bool, list[Breakpoint]]:
    """The chat messages of ``body``, whether any block was a tool block, and the breakpoints
    of ``system`` and the messages, in order."""
    out: list[ChatMessage] = []
    marks: list[Breakpoint] = []
    if body.system is not None:
        system = body.system
        texts = [system] if isinstance(system, str) else [b.text for b in system]
        for j, block in enumerate([] if isinstance(system, str) else system):
            marks += block_breakpoint(block, f"system.{j}", 0, joined_length(texts[: j + 1]))
        out.append(ChatMessage("system", "\n".join(texts)))
    calls: dict[str, str] = {}  # tool_use id -> the tool's name, in order
    used_tools = False
    for i, message in enumerate(body.messages):
        blocks = _blocks(message, f"messages.{i}.content")
        used_tools |= any(isinstance(b, ToolUseBlock | ToolResultBlock) for b in blocks)
        if message.role == "assistant":
            out.append(_assistant(blocks, f"messages.{i}.content", calls, len(out), marks))
        else:
            out.extend(_user(blocks, f"messages.{i}.content", calls, len(out), marks))
    return tuple(out), used_tools, marks


def _blocks(message: MessageIn, field: str) -> list[BaseModel]:
    """The content blocks of ``message``, each checked by its type (text: one text block)."""
    if isinstance(message.content, str):
        return [TextBlock(type="text", text=message.content)]
    if not message.content:
        raise InvalidArgument(field, "empty (send at least one content block)")
    blocks = []
    for j, block in enumerate(message.content):
        kind = block.get("type")
        model = BLOCKS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise InvalidArgument(
                f"{field}.{j}.type",
                f"{str(kind)[:64]!r} blocks are not supported (only {', '.join(BLOCKS)})",
            )
        try:
            blocks.append(model.model_validate(block))
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise InvalidArgument(dotted(f"{field}.{j}", first["loc"]), first["msg"]) from None
    return blocks


def _assistant(
    blocks: list[BaseModel],
    field: str,
    calls: dict[str, str],
    index: int,
    marks: list[Breakpoint],
) -> ChatMessage:
    """The assistant message of ``blocks``, message ``index`` of the chat; its breakpoints are
    added to ``marks`` (a ``tool_use`` block's at the end of the text, known at the end)."""
    texts, thoughts, tool_calls = [], [], []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
            marks += block_breakpoint(block, f"{field}.{j}", index, joined_length(texts))
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            if block.id in calls:
                raise InvalidArgument(f"{field}.{j}.id", f"{block.id[:64]!r} is used twice")
            calls[block.id] = block.name
            arguments = json.dumps(block.input, ensure_ascii=False)
            tool_calls.append(ToolCall(block.id, block.name, arguments))
            marks += block_breakpoint(block, f"{field}.{j}", index, -1)
        else:
            raise InvalidArgument(f"{field}.{j}.type", "an assistant sends no tool_result")
    end = joined_length(texts)
    marks[:] = [
        Breakpoint(m.field, m.ttl, index, end) if m.content_offset < 0 else m for m in marks
    ]
    return ChatMessage(
        "assistant",
        "\n".join(texts),
        tool_calls=tuple(tool_calls),
        reasoning_content="\n".join(thoughts),
    )


def _user(
    blocks: list[BaseModel],
    field: str,
    calls: dict[str, str],
    index: int,
    marks: list[Breakpoint],
) -> list[ChatMessage]:
    """The messages of a user's ``blocks``, the first message ``index`` of the chat; their
    breakpoints are added to ``marks``."""
    out: list[ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
            marks += block_breakpoint(block, f"{field}.{j}", index + len(out), joined_length(texts))
            continue
        if not isinstance(block, ToolResultBlock):
            kind = "tool_use" if isinstance(block, ToolUseBlock) else "thinking"
            raise InvalidArgument(f"{field}.{j}.type", f"a user sends no {kind} block")
        if block.tool_use_id not in calls:
            raise InvalidArgument(
                f"{field}.{j}.tool_use_id",
                f"{block.tool_use_id[:64]!r}: no earlier tool_use block has this id",
            )
        if texts:
            out.append(ChatMessage("user", "\n".join(texts)))
            texts = []
        content = [] if isinstance(block.content, str) else block.content
        parts = [block.content] if isinstance(block.content, str) else [b.text for b in content]
        for k, part in enumerate(content):
            end = joined_length(parts[: k + 1])
            marks += block_breakpoint(part, f"{field}.{j}.content.{k}", index + len(out), end)
        text = "\n".join(parts)
        marks += block_breakpoint(block, f"{field}.{j}", index + len(out), len(text))
        out.append(
            ChatMessage("tool", text, calls[block.tool_use_id], tool_call_id=block.tool_use_id)
        )
    if texts:
        out.append(ChatMessage("user", "\n".join(texts)))
    return out


def dotted(prefix: str, loc: tuple[int | str, ...]) -> str:
    """Anthropic's name of a field pydantic located at ``loc`` below ``prefix`` (""): the parts
    joined with dots, the names pydantic gives the members of a union left out
    (``messages.0.content.2.input``)."""
    parts = [prefix] if prefix else []
    for part in loc:
        if isinstance(part, str) and (part in UNION_TAGS or "[" in part or "-" in part):
            continue
        parts.append(str(part))
    return ".".join(parts)
