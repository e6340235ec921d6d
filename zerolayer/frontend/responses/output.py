"""Generations to the Responses API's response object and output items (plain dicts, sent as
JSON).

Shapes: https://platform.openai.com/docs/api-reference/responses/object (the ``Response``
schema of OpenAI's OpenAPI document). A response's output is, in order: a ``reasoning`` item (the
thought, when the model's template reasons), a ``message`` with one ``output_text`` part (the
answer; left out when the model only called tools), one ``function_call`` item per tool call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from zerolayer.common.generation import FinishReason, GenerationChunk, Usage, join_chunks
from zerolayer.frontend.responses.schema import CreateResponseRequest
from zerolayer.frontend.responses.seam import ToolCall, chunk_parts, join_tool_calls


def new_item_id(prefix: str) -> str:
    """A fresh item id: ``msg_``, ``rs_``, ``fc_`` and the like, then 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponseHead:
    """What every form of one response carries: its id, time, model and the request's echoed
    parameters."""

    id: str
    """``resp_<request id>``."""
    created_at: int
    """Unix time, seconds."""
    model: str
    echo: dict
    """The request's parameters as the response object repeats them."""


def response_head(body: CreateResponseRequest, request_id: str, model: str) -> ResponseHead:
    """The head of the response to ``body``: its parameters echoed with OpenAI's defaults."""
    text_format = body.text.format if body.text and body.text.format else None
    text: dict = {"format": {"type": "text"}}
    if text_format is not None:
        text["format"] = text_format.model_dump(by_alias=True, exclude_unset=True)
        if text_format.type != "json_schema":
            text["format"] = {"type": text_format.type}
    if body.text and body.text.verbosity:
        text["verbosity"] = body.text.verbosity
    reasoning = body.reasoning.model_dump(exclude_none=True) if body.reasoning else {}
    echo = {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": [t.model_dump() for t in body.tools or ()],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled",
        "background": False,
        "service_tier": body.service_tier or "default",
    }
    identifiers = ("user", "safety_identifier", "prompt_cache_key")
    echo |= {name: getattr(body, name) for name in identifiers if getattr(body, name) is not None}
    return ResponseHead(f"resp_{request_id}", int(time.time()), model, echo)


def usage_body(usage: Usage | None, num_reasoning_tokens: int) -> dict | None:
    """The Responses API's ``usage`` (None stays None). ``cache_write_tokens`` (which the spec
    requires) counts the prompt tokens computed rather than read from the prefix cache: the
    cache keeps their whole blocks for the next request."""
    if usage is None:
        return None
    cached = usage.cached_prompt_tokens
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached,
            "cache_write_tokens": usage.prompt_tokens - cached,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def status_of(finish_reason: FinishReason) -> str:
    """The response's ``status`` once it ended so: ``incomplete`` at the token limit,
    ``failed`` when the scheduler gave it up, else ``completed``."""
    if finish_reason == FinishReason.LENGTH:
        return "incomplete"
    return "failed" if finish_reason == FinishReason.ABORT else "completed"


def response_body(
    head: ResponseHead,
    status: str,
    output: Sequence[dict],
    usage: dict | None,
    error: dict | None = None,
) -> dict:
    """The response object: ``status`` one of ``in_progress``, ``completed``, ``incomplete``
    (``incomplete_details.reason``: ``max_output_tokens``) or ``failed`` (with ``error``:
    ``{"code", "message"}``)."""
    if status == "failed" and error is None:
        error = {"code": "server_error", "message": "the scheduler gave the request up"}
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    body = {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": head.model,
        "output": list(output),
        **head.echo,
    }
    if usage is not None:  # NOTE: not nullable in the spec: absent while in progress
        body["usage"] = usage
    return body


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A ``reasoning`` item whose ``content`` is the thought's text (no summary is made)."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    """An assistant ``message`` item: one ``output_text`` part (None: none yet)."""
    content = [] if text is None else [output_text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def function_call_item(item_id: str, call: ToolCall, status: str) -> dict:
    """A ``function_call`` item of a tool call the model made."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def output_items(
    text: str, reasoning: str, calls: Sequence[ToolCall], item_status: str
) -> list[dict]:
    """The output items of a whole generation (see the module docstring)."""
    items = []
    if reasoning:
        items.append(reasoning_item(new_item_id("rs"), reasoning, item_status))
    if text or not calls:
        items.append(message_item(new_item_id("msg"), text, item_status))
    items += [function_call_item(new_item_id("fc"), call, item_status) for call in calls]
    return items


def whole_response(head: ResponseHead, chunks: Sequence[GenerationChunk]) -> dict:
    """The response object of a whole (not streamed) generation of one sample."""
    texts, thoughts = [], []
    num_reasoning_tokens = 0
    for chunk in chunks:
        text, reasoning, tool_deltas = chunk_parts(chunk)
        texts.append(text)
        thoughts.append(reasoning)
        if reasoning and not text and not tool_deltas:
            num_reasoning_tokens += len(chunk.token_ids)
    whole = join_chunks(chunks)
    status = status_of(whole.finish_reason)
    item_status = "completed" if status == "completed" else "incomplete"
    calls = join_tool_calls(chunks)
    output = output_items("".join(texts), "".join(thoughts), calls, item_status)
    return response_body(head, status, output, usage_body(whole.usage, num_reasoning_tokens))
