"""A ``POST /v1/responses`` body (``zerolayer.frontend.responses.schema``) to the generation it
asks for, and the conversation it continues.

What the public gRPC API validates (ranges, the model, the context) is left to
``zerolayer.frontend.text.validation``; here only what the Responses API's shape adds is
checked: the items, the fields zerolayer does not implement, the tools and ``tool_choice``,
``text.format``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import MAX_PIN_TTL_S, CachePin, GenerateParams, StructuredOutput
from zerolayer.frontend.openai.params import cache_pins
from zerolayer.frontend.responses.items import chat_messages, parse_items
from zerolayer.frontend.responses.schema import CreateResponseRequest, TextFormat
from zerolayer.frontend.responses.seam import ToolChoice, ToolDefinition, tool_params
from zerolayer.frontend.responses.store import StoredResponse

OPENAI_DEFAULT_TEMPERATURE = 1.0
"""Temperature of a request that leaves it unset (OpenAI's default; gRPC's is greedy)."""
TOOL_CHOICE_MODES = ("none", "auto", "required")


@dataclass(frozen=True)
class ResponseRequest:
    """What one ``POST /v1/responses`` asks for."""

    params: GenerateParams
    input_items: tuple[dict, ...]
    """This request's input items (a text input: one user message)."""
    conversation: tuple[dict, ...]
    """The previous response's conversation (if any), then :attr:`input_items`."""


def response_request(
    body: CreateResponseRequest,
    request_id: str,
    previous: StoredResponse | None,
    stored_for_s: float = 0.0,
) -> ResponseRequest:
    """The generation ``body`` asks for, continuing ``previous`` (its ``previous_response_id``,
    found by the caller): the conversation's items rendered with the model's chat template.

    A response that is stored (``stored_for_s`` > 0, the store's max age in seconds) pins its
    context, prompt and output, for that long, so that a request continuing it prefills only
    its new input (the pin ends when the store drops the response); OpenAI's prompt-cache
    fields pin the prompt as on chat completions (``zerolayer.frontend.openai.params``).

    Raises:
        InvalidArgument: a field zerolayer does not implement, no input, an input item it does
            not serve (``input[i]...``), a ``function_call_output`` without its call, a
            ``tool_choice`` that names no tool, ``text.format`` json_schema without a schema;
            the field is OpenAI's name.
    """
    _refuse_unimplemented(body)
    if body.input is None or body.input == []:
        raise InvalidArgument("input", "required (a text or at least one item)")
    input_items = parse_items(body.input)
    stored = previous.conversation if previous is not None else ()
    conversation = (*stored, *input_items)
    messages = chat_messages(conversation, body.instructions, len(stored))
    tools = tuple(
        ToolDefinition(t.name, t.description or "", json.dumps(t.parameters or {"type": "object"}))
        for t in body.tools or ()
    )
    choice = _tool_choice(body.tool_choice, {t.name for t in tools})
    temperature = OPENAI_DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    effort = body.reasoning.effort if body.reasoning else None
    params = GenerateParams(
        messages=messages,
        max_new_tokens=body.max_output_tokens or 0,
        temperature=temperature,
        top_p=body.top_p,
        request_id=request_id,
        model=body.model,
        structured_output=_structured_output(body.text.format if body.text else None),
        **tool_params(tools, choice, body.parallel_tool_calls is not False, effort),
        cache_pins=_cache_pins(body, stored_for_s),
    )
    return ResponseRequest(params, input_items, conversation)


def _cache_pins(body: CreateResponseRequest, stored_for_s: float) -> tuple[CachePin, ...]:
    pins = cache_pins(body.prompt_cache_retention, body.prompt_cache_key, None)
    if stored_for_s > 0:
        ttl_s = max(1, min(round(stored_for_s), MAX_PIN_TTL_S))
        pins += (CachePin(ttl_s, include_output=True),)
    return pins


def _refuse_unimplemented(body: CreateResponseRequest) -> None:
    if body.truncation == "auto":
        raise InvalidArgument("truncation", "not supported (only 'disabled')")
    if body.background:
        raise InvalidArgument("background", "not supported")
    if body.top_logprobs:
        raise InvalidArgument("top_logprobs", "not supported")
    if body.conversation is not None:
        raise InvalidArgument("conversation", "not supported (use previous_response_id)")
    if body.prompt is not None:
        raise InvalidArgument("prompt", "not supported (stored prompts)")


def _tool_choice(value: str | dict | None, names: set[str]) -> ToolChoice | None:
    """The ``tool_choice`` of a request whose tools are ``names``; None: unset.

    Raises:
        InvalidArgument: ``tool_choice``: not a mode or ``{"type": "function", "name": ...}``
            of one of the tools.
    """
    if value is None or isinstance(value, str):
        return None if value is None else ToolChoice(value)
    name = value.get("name")
    if set(value) != {"type", "name"} or value["type"] != "function" or not isinstance(name, str):
        raise InvalidArgument(
            "tool_choice", 'one of "none", "auto", "required" or {"type": "function", "name"}'
        )
    if name not in names:
        raise InvalidArgument("tool_choice", f"names no tool of the request: {name[:64]!r}")
    return ToolChoice("function", name)


def _structured_output(text_format: TextFormat | None) -> StructuredOutput | None:
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return StructuredOutput("json_object")
    if text_format.json_schema is None:
        raise InvalidArgument("text.format", "json_schema needs schema")
    return StructuredOutput("json_schema", json.dumps(text_format.json_schema))
