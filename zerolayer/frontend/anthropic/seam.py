"""NOTE: stand-ins for the tool and reasoning types of issue 30's seam until i30-tools adds them
to ``zerolayer.common.generation``: the same names, fields and defaults, so that swapping them is
one import line in each module that uses them (``from zerolayer.common.generation import ...``)
and deleting this file. ``reasoning_text`` and ``tool_call_deltas`` read a chunk's fields of the
same names, which today's ``GenerationChunk`` lacks; after the merge they are plain attribute
reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolayer.common.generation import GenerationChunk as CommonChunk


@dataclass(frozen=True)
class ToolDefinition:
    """One function tool the model may call."""

    name: str
    description: str = ""
    parameters_json: str = '{"type": "object"}'
    """Its JSON schema, as JSON text."""


@dataclass(frozen=True)
class ToolChoice:
    """Which tools the model may or must call."""

    mode: str = "auto"
    """"auto" | "none" | "required" | "function"."""
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
    """Which call of this choice (0, 1, ...)."""
    id: str = ""
    """On the call's first delta only."""
    name: str = ""
    """On the call's first delta only."""
    arguments: str = ""
    """The next piece of the arguments' JSON text."""


@dataclass(frozen=True)
class ChatMessage:
    """``zerolayer.common.generation.ChatMessage`` with the seam's fields."""

    role: str
    content: str
    name: str = ""
    tool_call_id: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_content: str = ""


@dataclass(frozen=True)
class GenerationChunk(CommonChunk):
    """``zerolayer.common.generation.GenerationChunk`` with the seam's fields."""

    reasoning_text: str = ""
    tool_call_deltas: tuple[ToolCallDelta, ...] = ()


def reasoning_text(chunk: CommonChunk) -> str:
    """The chunk's thought (see the module's NOTE)."""
    return getattr(chunk, "reasoning_text", "")


def tool_call_deltas(chunk: CommonChunk) -> tuple[ToolCallDelta, ...]:
    """The chunk's pieces of tool calls (see the module's NOTE)."""
    return getattr(chunk, "tool_call_deltas", ())
