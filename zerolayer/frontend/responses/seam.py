"""The tool and reasoning types of issue 30's seam (``zerolayer.common.generation``, added by the
tool-calling work), as this room uses them.

NOTE: stand-ins until the seam is merged: the classes and ``join_tool_calls`` below then give
way to the import of the real ``ChatMessage, ToolCall, ToolCallDelta, ToolChoice,
ToolDefinition, join_tool_calls`` from ``zerolayer.common.generation`` (``__all__`` keeps them
exported), :data:`TOOLS_IN_THIS_BUILD` turns true by itself, and :func:`chunk_parts` may read the
chunk's fields directly. Until then a request that needs the tool machinery (tools, function
calls in the input) is refused naming its field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage as _BaseChatMessage
from zerolayer.common.generation import GenerationChunk

__all__ = [
    "ChatMessage",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolDefinition",
    "chunk_parts",
    "join_tool_calls",
    "needs_tools",
    "tool_params",
]


@dataclass(frozen=True)
class ToolDefinition:
    """One function tool the model may call."""

    name: str
    description: str = ""
    parameters_json: str = '{"type": "object"}'
    """Its parameters' JSON schema, as JSON text."""


@dataclass(frozen=True)
class ToolChoice:
    """Which tools the model may or must call."""

    mode: str = "auto"
    """"auto", "none", "required" or "function"."""
    name: str = ""
    """The function, when ``mode`` is "function"."""


@dataclass(frozen=True)
class ToolCall:
    """One call, in a message of the history or in the output."""

    id: str
    name: str
    arguments: str
    """JSON text."""


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call."""

    index: int
    """Which call of this output (0, 1, ...)."""
    id: str = ""
    """On the call's first delta only."""
    name: str = ""
    """On the call's first delta only."""
    arguments: str = ""
    """The next piece of the arguments' JSON text."""


@dataclass(frozen=True)
class ChatMessage(_BaseChatMessage):
    """A chat message with the seam's fields."""

    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_content: str = ""


TOOLS_IN_THIS_BUILD = "tool_calls" in {f.name for f in dataclasses.fields(_BaseChatMessage)}
"""The generation machinery renders tool calls and parses the output (False: stand-ins)."""


def chunk_parts(chunk: GenerationChunk) -> tuple[str, str, tuple[ToolCallDelta, ...]]:
    """A chunk's answer text, reasoning text and tool-call deltas (the last two empty while
    the machinery is not in this build)."""
    reasoning = getattr(chunk, "reasoning_text", "")
    return chunk.text, reasoning, tuple(getattr(chunk, "tool_call_deltas", ()))


def join_tool_calls(chunks: Sequence[GenerationChunk]) -> tuple[ToolCall, ...]:
    """The whole calls of a generation's chunks, in order: by the deltas' ``index``, the first
    delta's id and name, the arguments' pieces joined."""
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for delta in chunk_parts(chunk)[2]:
            call = calls.setdefault(delta.index, ["", "", ""])
            call[0] = call[0] or delta.id
            call[1] = call[1] or delta.name
            call[2] += delta.arguments
    return tuple(ToolCall(*calls[i]) for i in sorted(calls))


def tool_params(
    tools: tuple[ToolDefinition, ...],
    tool_choice: ToolChoice | None,
    parallel: bool,
    reasoning_effort: str | None = None,
) -> dict:
    """The GenerateParams fields of a request's tools and reasoning (by name; the output is
    always parsed). ``reasoning_effort`` reaches the chat template as the variable of that name
    (as chat completions' ``reasoning_effort``); None: not set.

    Raises:
        InvalidArgument: ``tools`` (unless ``tool_choice`` is "none"), while the machinery is
            not in this build.
    """
    if not TOOLS_IN_THIS_BUILD:
        if tools and (tool_choice is None or tool_choice.mode != "none"):
            raise InvalidArgument("tools", "not supported by this build")
        return {}
    kwargs = {"reasoning_effort": reasoning_effort} if reasoning_effort else {}
    return {  # pragma: no cover - the seam's fields
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "chat_template_kwargs_json": json.dumps(kwargs) if kwargs else "",
        "parse_output": True,
    }


def needs_tools(field: str) -> None:
    """Raises InvalidArgument naming ``field`` while the machinery is not in this build."""
    if not TOOLS_IN_THIS_BUILD:
        raise InvalidArgument(field, "function calls are not supported by this build")
