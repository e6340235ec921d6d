"""OpenAI request bodies (``zerolayer.frontend.openai.schema``) to :class:`GenerateParams`.

What the public gRPC API validates (ranges, the model name, the context) is left to
``zerolayer.frontend.text.validation``; here only what OpenAI's shape adds is checked: one prompt,
the fields zerolayer does not implement, ``logit_bias`` keys, ``top_logprobs`` without
``logprobs``, a ``json_schema`` format without a schema.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    CachePin,
    ChatMessage,
    GenerateParams,
    StructuredOutput,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from zerolayer.frontend.openai.schema import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    FunctionDefinition,
    ResponseFormat,
    SamplingFields,
)
from zerolayer.kv.pin import MAX_PIN_KEY_BYTES

RETENTION_TTL_S = {"24h": 86400}
"""``prompt_cache_retention`` -> pin ttl, seconds (``in_memory``: no pin)."""
OPTIONS_TTL_S = {"30m": 1800}
"""``prompt_cache_options.ttl`` -> pin ttl, seconds (OpenAI's only value)."""
OPENAI_DEFAULT_TEMPERATURE = 1.0
"""Temperature of a request that leaves it unset (OpenAI's default; gRPC's is greedy)."""
SEED_MODULUS = 2**64
"""Seeds are uint64 in zerolayer; OpenAI takes any integer: a negative one wraps around."""

PARAM_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "prompt_token_ids": "prompt",
    "structured_output": "response_format",
}
"""GenerateParams field -> the OpenAI field a client sent it as (the rest are the same)."""
CHAT_PARAM_NAMES = {"logprobs": "top_logprobs", "prompt": "messages"}
"""The same, where a chat differs."""


def completion_params(body: CompletionRequest, request_id: str) -> GenerateParams:
    """The generation a ``/v1/completions`` body asks for.

    Raises:
        InvalidArgument: several prompts, ``echo``, ``suffix``, ``best_of`` > 1, or see
            :func:`_sampling_fields`; the field is OpenAI's name.
    """
    if body.echo:
        raise InvalidArgument("echo", "not supported")
    if body.suffix:
        raise InvalidArgument("suffix", "not supported")
    if body.best_of is not None and body.best_of > 1:
        raise InvalidArgument("best_of", "not supported (use n)")
    prompt, prompt_token_ids = _one_prompt(body.prompt)
    return GenerateParams(
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        logprobs=body.logprobs,
        **_sampling_fields(body, body.max_tokens, request_id),
    )


def chat_params(body: ChatCompletionRequest, request_id: str) -> GenerateParams:
    """The generation a ``/v1/chat/completions`` body asks for: the messages are rendered with
    the model's chat template by validation.

    The output is parsed (``parse_output``): reasoning and tool calls apart from the content.

    Raises:
        InvalidArgument: both ``tools`` and ``functions``, a tool message that answers no earlier
            call, non-text content, audio output, web search, moderation, ``top_logprobs``
            without ``logprobs``, or see :func:`_sampling_fields`; the field is OpenAI's name.
    """
    _refuse_what_cannot_be_done(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidArgument("top_logprobs", "needs logprobs: true")
    messages = tuple(_chat_message(i, m) for i, m in enumerate(body.messages))
    _check_tool_answers(messages)
    max_tokens = body.max_completion_tokens or body.max_tokens
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    return GenerateParams(
        messages=messages,
        add_generation_prompt=body.add_generation_prompt,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        tools=_tools(body),
        tool_choice=_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        chat_template_kwargs_json=json.dumps(kwargs) if kwargs else "",
        parse_output=True,
        **_sampling_fields(body, max_tokens, request_id),
    )


def _refuse_what_cannot_be_done(body: ChatCompletionRequest) -> None:
    """Refuses the chat fields whose value asks for what zerolayer does not do.

    Raises:
        InvalidArgument: audio output (``modalities``, ``audio``), ``web_search_options``,
            ``moderation``.
    """
    if body.modalities is not None and body.modalities != ["text"]:
        raise InvalidArgument("modalities", 'only ["text"] is supported (no audio output)')
    for field in ("audio", "web_search_options", "moderation"):
        if getattr(body, field) is not None:
            raise InvalidArgument(field, "not supported")


def _tools(body: ChatCompletionRequest) -> tuple[ToolDefinition, ...]:
    """``tools``, or the legacy ``functions`` taken as tools."""
    if body.tools and body.functions:
        raise InvalidArgument("functions", "give tools or functions, not both")
    functions = [t.function for t in body.tools or ()] or list(body.functions or ())
    return tuple(_tool(f) for f in functions)


def _tool(function: FunctionDefinition) -> ToolDefinition:
    parameters = {"type": "object"} if function.parameters is None else function.parameters
    return ToolDefinition(function.name, function.description, json.dumps(parameters))


def _tool_choice(body: ChatCompletionRequest) -> ToolChoice | None:
    """``tool_choice``, or the legacy ``function_call`` (``{"name"}``: that function)."""
    choice = body.tool_choice if body.tool_choice is not None else body.function_call
    if choice is None:
        return None
    if isinstance(choice, str):
        return ToolChoice(choice)
    name = choice.function.name if hasattr(choice, "function") else choice.name
    return ToolChoice("function", name)


def _check_tool_answers(messages: tuple[ChatMessage, ...]) -> None:
    """Refuses a tool message whose ``tool_call_id`` no earlier assistant message called."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        called.update(call.id for call in message.tool_calls)
        if message.role == "tool" and message.tool_call_id not in called:
            raise InvalidArgument(
                f"messages[{i}].tool_call_id",
                f"{message.tool_call_id[:64]!r} answers no earlier assistant message's tool call",
            )


def _one_prompt(
    prompt: str | list[int] | list[str] | list[list[int]],
) -> tuple[str | None, tuple[int, ...] | None]:
    """(text, None) or (None, token ids) of the one prompt in ``prompt``."""
    if isinstance(prompt, str):
        return prompt, None
    if prompt and all(isinstance(p, int) for p in prompt):
        return None, tuple(prompt)  # type: ignore[arg-type]
    if len(prompt) != 1:
        raise InvalidArgument("prompt", f"{len(prompt)} prompts; one per request is supported")
    only = prompt[0]
    return (only, None) if isinstance(only, str) else (None, tuple(only))  # type: ignore[arg-type]


def _chat_message(index: int, message: ChatMessageIn) -> ChatMessage:
    field = f"messages[{index}]"
    for unsupported in ("function_call", "audio"):
        if getattr(message, unsupported) is not None:
            raise InvalidArgument(f"{field}.{unsupported}", "not supported")
    content = message.content
    if isinstance(content, list):
        kinds = sorted({part.type for part in content} - {"text", "refusal"})
        if kinds:
            raise InvalidArgument(f"{field}.content", f"only text parts are supported, not {kinds}")
        content = "".join(part.text or part.refusal for part in content)
    content = content or message.refusal
    # NOTE: OpenAI's "developer" role is the system prompt of newer models; chat templates
    # know "system".
    role = "system" if message.role == "developer" else message.role
    calls = tuple(
        ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()
    )
    reasoning = message.reasoning_content or ""
    return ChatMessage(role, content or "", message.name, message.tool_call_id, calls, reasoning)


def _sampling_fields(body: SamplingFields, max_tokens: int | None, request_id: str) -> dict:
    """The GenerateParams fields both endpoints share, by name.

    Raises:
        InvalidArgument: a ``logit_bias`` key that is not a token id, or a ``json_schema``
            response format without a schema.
    """
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    temperature = OPENAI_DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    return {
        "max_new_tokens": max_tokens or 0,
        "temperature": temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": None if body.seed is None else body.seed % SEED_MODULUS,
        "stop": stop,
        "ignore_eos": body.ignore_eos,
        "cache_salt": body.cache_salt,
        "cache_pins": cache_pins(
            body.prompt_cache_retention, body.prompt_cache_key, body.prompt_cache_options
        ),
        "request_id": request_id,
        "model": body.model,
        "repetition_penalty": body.repetition_penalty,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "min_p": body.min_p,
        "min_new_tokens": body.min_tokens,
        "stop_token_ids": tuple(body.stop_token_ids or ()),
        "logit_bias": _logit_bias(body.logit_bias or {}),
        "prompt_logprobs": body.prompt_logprobs,
        "n": body.n,
        "structured_output": _structured_output(body.response_format),
    }


def _logit_bias(logit_bias: dict[str, float]) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs, ids ascending, of OpenAI's ``{"<id>": bias}``."""
    pairs = []
    for key, bias in logit_bias.items():
        if not (key.isascii() and key.isdigit()):
            raise InvalidArgument("logit_bias", f"key {key[:32]!r} is not a token id")
        pairs.append((int(key), bias))
    return tuple(sorted(pairs))


def _structured_output(response_format: ResponseFormat | None) -> StructuredOutput | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return StructuredOutput("json_object")
    schema = response_format.json_schema.json_schema if response_format.json_schema else None
    if schema is None:
        raise InvalidArgument("response_format", "json_schema needs json_schema.schema")
    return StructuredOutput("json_schema", json.dumps(schema))


def cache_pins(
    retention: str | None, key: str | None, options: dict[str, Any] | None
) -> tuple[CachePin, ...]:
    """The pin OpenAI's prompt-cache fields ask for: the whole prompt, for the longer of
    ``prompt_cache_retention`` (``24h``) and an implicit ``prompt_cache_options.ttl`` (``30m``),
    keyed by ``prompt_cache_key``; none for ``in_memory`` or neither.

    Raises:
        InvalidArgument: ``prompt_cache_options`` with a key, ``ttl`` or ``mode`` OpenAI does not
            define (``prompt_cache_options.ttl``, ...), a ``prompt_cache_retention`` other than
            ``in_memory`` or ``24h``, a ``prompt_cache_key`` over 256 bytes.
    """
    if retention not in (None, "in_memory", *RETENTION_TTL_S):
        raise InvalidArgument("prompt_cache_retention", "'in_memory' or '24h'")
    if key is not None and len(key.encode("utf-8", "surrogatepass")) > MAX_PIN_KEY_BYTES:
        raise InvalidArgument("prompt_cache_key", f"longer than {MAX_PIN_KEY_BYTES} bytes")
    ttl_s = RETENTION_TTL_S.get(retention or "", 0)
    if options is not None:
        for name in options:
            if name not in ("ttl", "mode"):
                raise InvalidArgument(f"prompt_cache_options.{name}"[:80], "unknown field")
        ttl = options.get("ttl") or "30m"  # null: the default
        if ttl not in OPTIONS_TTL_S:
            raise InvalidArgument("prompt_cache_options.ttl", f"{str(ttl)[:40]!r}; only '30m'")
        mode = options.get("mode") or "implicit"
        if mode not in ("implicit", "explicit"):
            raise InvalidArgument("prompt_cache_options.mode", "'implicit' or 'explicit'")
        if mode == "implicit":
            ttl_s = max(ttl_s, OPTIONS_TTL_S[ttl])
    return (CachePin(ttl_s, key=key or ""),) if ttl_s else ()


def new_request_id() -> str:
    """A fresh request id (32 hex digits), also the response's ``id`` after its prefix."""
    return uuid.uuid4().hex


def openai_param(field: str, chat: bool) -> str:
    """The OpenAI name of the GenerateParams ``field`` an error names (``stop[2]`` -> ``stop``,
    ``structured_output.json_schema`` -> ``response_format``; in a chat, ``logprobs`` ->
    ``top_logprobs`` and ``prompt`` -> ``messages``)."""
    if field.startswith("stop["):
        return "stop"
    if field.startswith("structured_output"):  # structured_output.json_schema and the like
        return "response_format"
    if field.startswith("tools[") and field.endswith(".parameters_json"):
        return field.removesuffix(".parameters_json").replace("]", "].function.parameters", 1)
    if field.startswith("tools[") and field.endswith(".name"):
        return field.replace("].name", "].function.name", 1)
    if chat and field in CHAT_PARAM_NAMES:
        return CHAT_PARAM_NAMES[field]
    return PARAM_NAMES.get(field, field)
