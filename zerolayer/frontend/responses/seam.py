"""The tool and reasoning types of issue 30's seam (``zerolayer.common.generation``) as this room
uses them: the chunk's parts, and the GenerateParams fields of a request's tools."""

from __future__ import annotations

import json

from zerolayer.common.generation import (
    ChatMessage,
    GenerationChunk,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    join_tool_calls,
)

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


def chunk_parts(chunk: GenerationChunk) -> tuple[str, str, tuple[ToolCallDelta, ...]]:
    """A chunk's answer text, reasoning text and tool-call deltas."""
    return chunk.text, chunk.reasoning_text, chunk.tool_call_deltas


def tool_params(
    tools: tuple[ToolDefinition, ...],
    tool_choice: ToolChoice | None,
    parallel: bool,
    reasoning_effort: str | None = None,
) -> dict:
    """The GenerateParams fields of a request's tools and reasoning (by name; the output is
    always parsed). ``reasoning_effort`` reaches the chat template as the variable of that name
    (as chat completions' ``reasoning_effort``); None: not set."""
    kwargs = {"reasoning_effort": reasoning_effort} if reasoning_effort else {}
    return {
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "chat_template_kwargs_json": json.dumps(kwargs) if kwargs else "",
        "parse_output": True,
    }


def needs_tools(field: str) -> None:
    """Nothing: the tool machinery is in this build (kept for the items' translation)."""
