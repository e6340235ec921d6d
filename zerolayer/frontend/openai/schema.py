"""The request bodies of the OpenAI-compatible HTTP API, as pydantic models.

OpenAI's API reference: https://platform.openai.com/docs/api-reference/completions/create and
https://platform.openai.com/docs/api-reference/chat/create. Fields OpenAI defines that zerolayer
does not implement are declared so that a request setting them is refused naming the field
(``zerolayer.frontend.openai.params``); fields nobody defines are refused by pydantic
(``extra="forbid"``, as OpenAI answers "Unrecognized request argument"). The vLLM-style
extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``,
``ignore_eos``, ``cache_salt``, ``prompt_logprobs``) are zerolayer's own sampling fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class StreamOptions(BaseModel):
    """``stream_options``."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    """Send a last chunk with empty ``choices`` and the request's ``usage``."""
    continuous_usage_stats: StrictBool = False
    """vLLM's: ``usage`` on every chunk (so far)."""


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: StrictStr = ""
    description: StrictStr = ""
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text`` (free), ``json_object`` or ``json_schema``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = ""
    """Empty: the served model."""
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = None
    """None: 1 (OpenAI's default)."""
    top_p: float | None = None
    n: StrictInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, JSON keys being strings) -> bias."""
    seed: StrictInt | None = None
    """Any 64-bit integer; a negative one is taken modulo 2**64."""
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None
    """Ignored (OpenAI's abuse monitoring)."""
    # vLLM-style extensions
    top_k: StrictInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: StrictInt = Field(default=0, ge=0)
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    cache_salt: StrictStr = ""
    prompt_logprobs: StrictInt | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    """Text, or token ids; a list of several prompts is refused (no batches)."""
    logprobs: StrictInt | None = Field(default=None, ge=0)
    """Top alternatives per generated token (the chosen one always comes too)."""
    echo: StrictBool = False
    """Not implemented: true is refused."""
    suffix: StrictStr | None = None
    """Not implemented: set is refused."""
    best_of: StrictInt | None = None
    """Not implemented: above 1 is refused."""


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts are implemented."""

    model_config = ConfigDict(extra="allow")

    type: StrictStr
    text: StrictStr = ""


class FunctionCallIn(BaseModel):
    """``tool_calls[i].function`` of an assistant message: the call's name and arguments."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    arguments: StrictStr
    """JSON text."""


class ToolCallIn(BaseModel):
    """One of an assistant message's ``tool_calls``."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    """One message of ``messages``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr = ""
    tool_call_id: StrictStr = ""
    tool_calls: list[ToolCallIn] | None = None
    """An assistant message's calls (its content may then be null)."""
    reasoning_content: StrictStr | None = None
    """An assistant message's thought (vLLM's field; templates such as Qwen3's render it)."""
    # NOTE: what the official client echoes back of an answer (``message.model_dump()``) carries
    # these as null; they say nothing to the model.
    refusal: StrictStr | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None


class FunctionDefinition(BaseModel):
    """A function the model may call (``tools[i].function``, or one of legacy ``functions``)."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    description: StrictStr = ""
    parameters: dict[str, Any] | None = None
    """Its arguments' JSON schema; None: no arguments (``{"type": "object"}``)."""
    strict: StrictBool | None = None
    """Accepted; calls are always valid against the schema when constrained (required, named)."""


class ToolIn(BaseModel):
    """One of ``tools``: only function tools exist in chat completions."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    """``{"name": ...}``."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming the function to call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    """Takes the place of ``max_tokens`` (which OpenAI deprecates); both: this one."""
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0)
    """Alternatives per token; needs ``logprobs``."""
    add_generation_prompt: StrictBool | None = None
    """vLLM's: end the rendered chat with the assistant's turn (None: yes)."""
    tools: list[ToolIn] | None = None
    """Functions the model may call (see docs/tools-and-reasoning.md)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """None: "auto" with tools, else "none"."""
    functions: list[FunctionDefinition] | None = None
    """OpenAI's deprecated form of ``tools`` (taken as tools; not both)."""
    function_call: Literal["none", "auto"] | FunctionName | None = None
    """OpenAI's deprecated form of ``tool_choice``."""
    parallel_tool_calls: StrictBool | None = None
    """False: at most one call. None: true."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: further variables of the chat template (e.g. ``enable_thinking``)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    """Given to the chat template as ``reasoning_effort`` (templates that read it use it)."""
