"""Generation chunks to Anthropic's message object (a plain dict, serialized as JSON).

Shape: https://docs.anthropic.com/en/api/messages (the response). Content blocks come in the
order a model writes them: its thought (``thinking``), its text (``text``), its calls
(``tool_use``, ``input`` the parsed arguments). ``usage`` follows Anthropic's accounting
(https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "Tracking cache
performance"): the prompt's tokens read from the prefix cache are ``cache_read_input_tokens``,
those the request's ``cache_control`` pins hold and did not read ``cache_creation_input_tokens``,
the rest ``input_tokens`` (the three sum to the prompt's length, what count_tokens counts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import (
    FinishReason,
    GenerationChunk,
    ToolCall,
    Usage,
    join_chunks,
    join_tool_calls,
)
from zerolayer.frontend.anthropic.breakpoints import TTL_S

STOP_REASONS = {
    "EOS": "end_turn",
    "STOP": "end_turn",
    "LENGTH": "max_tokens",
    "TOOL_CALLS": "tool_use",
}
"""Anthropic's ``stop_reason`` by the name of our FinishReason (a stop string that matched is
``stop_sequence``; TOOL_CALLS is the seam's). ABORT (the scheduler gave the request up) has none:
it answers an error."""


@dataclass(frozen=True)
class MessageHead:
    """What every body of one response carries."""

    id: str
    """``msg_<request id>``."""
    model: str
    pin_ttl_s: int = 0
    """The longest ttl of the request's ``cache_control`` breakpoints, seconds; 0: none."""


def stop_reason(finish_reason: FinishReason, stop_string: str) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a finished generation.

    Raises:
        Unavailable: the scheduler gave the request up (FinishReason.ABORT).
    """
    if finish_reason == FinishReason.STOP and stop_string:
        return "stop_sequence", stop_string
    reason = STOP_REASONS.get(finish_reason.name)
    if reason is None:
        raise Unavailable(
            f"scheduler: the generation ended without an answer ({finish_reason.name})"
        )
    return reason, None


def usage_body(usage: Usage | None, pin_ttl_s: int = 0) -> dict:
    """Anthropic's ``usage`` (zeros for None) of a request whose longest breakpoint lives
    ``pin_ttl_s`` seconds.

    ``cache_creation`` splits ``cache_creation_input_tokens`` by ttl; the kvstore reports the
    tokens written, not which pin wrote them, so all are the longest-lived breakpoint's
    (``ephemeral_1h_input_tokens`` when a ``1h`` breakpoint was asked for, else
    ``ephemeral_5m_input_tokens``; exact when all breakpoints share one ttl).
    """
    usage = usage or Usage(0, 0, 0)
    written = usage.cache_write_prompt_tokens
    hour = written if pin_ttl_s >= TTL_S["1h"] else 0
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_prompt_tokens - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": usage.cached_prompt_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written - hour,
            "ephemeral_1h_input_tokens": hour,
        },
        "output_tokens": usage.completion_tokens,
    }


def tool_use_block(call: ToolCall) -> dict:
    """A ``tool_use`` content block of ``call`` (its arguments parsed: Anthropic's ``input`` is
    an object; arguments that are not JSON come as ``{}``, which the tool-call parsers
    never give)."""
    try:
        arguments = json.loads(call.arguments) if call.arguments else {}
    except json.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def message_body(head: MessageHead, chunks: Sequence[GenerationChunk]) -> dict:
    """The body of a non-streamed response (the chunks of one sample, in order).

    Raises:
        Unavailable: see :func:`stop_reason`.
    """
    whole = join_chunks(chunks)
    reason, sequence = stop_reason(whole.finish_reason, whole.stop_string)
    thought = "".join(c.reasoning_text for c in chunks)
    calls = join_tool_calls(chunks)
    content: list[dict] = []
    if thought:
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    if whole.text or not calls:
        content.append({"type": "text", "text": whole.text})
    content += [tool_use_block(call) for call in calls]
    return {
        **message_start_body(head),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_body(whole.usage, head.pin_ttl_s),
    }


def message_start_body(head: MessageHead, usage: Usage | None = None) -> dict:
    """A message as ``message_start`` sends it (no content or stop reason yet)."""
    return {
        "id": head.id,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": head.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_body(usage, head.pin_ttl_s),
    }
