"""The request bodies of the OpenAI-compatible HTTP API, as pydantic models.

OpenAI's API reference: https://platform.openai.com/docs/api-reference/completions/create and
https://platform.openai.com/docs/api-reference/chat/create. Fields OpenAI defines that zerolayer
does not implement are declared so that a request setting them is refused naming the field
(``zerolayer.frontend.openai.params``); fields nobody defines are refused by pydantic
(``extra="forbid"``, as OpenAI answers "Unrecognized request argument"). A field set to null
takes its default, for every field (the spec marks most nullable, the default being what null
means). Fields that only carry metadata or hints for OpenAI's own service (``metadata``,
``store``, ``service_tier``, ``safety_identifier``, ``prompt_cache_key``, ...) are accepted and
ignored. The vLLM-style extensions (``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``stop_token_ids``, ``ignore_eos``, ``cache_salt``, ``prompt_logprobs``) are
zerolayer's own sampling fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)


def _integral(value: Any) -> Any:
    """A number with no fractional part as the int it is (``2.0`` -> 2): JSON Schema's
    ``integer`` (draft 2020-12, section 6.1.1 of the validation vocabulary), which OpenAI's
    schemas use; anything else is left to StrictInt (a bool or a string is no integer)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[StrictInt, BeforeValidator(_integral)]
"""An integer field: an int, or a float with no fractional part."""


class OpenAIBody(BaseModel):
    """A JSON object of a request body: unknown fields refused, null meaning the default."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """Drops the declared fields set to null, which then take their defaults (undeclared
        ones stay, to be refused as unrecognized)."""
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}


class StreamOptions(OpenAIBody):
    """``stream_options``."""

    include_usage: StrictBool = False
    """Send a last chunk with empty ``choices`` and the request's ``usage``."""
    include_obfuscation: StrictBool = False
    """Ignored (OpenAI pads its chunks against side channels; nothing is padded here)."""
    continuous_usage_stats: StrictBool = False
    """vLLM's: ``usage`` on every chunk (so far)."""


class JsonSchemaFormat(OpenAIBody):
    """``response_format.json_schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: StrictStr = ""
    description: StrictStr = ""
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIBody):
    """``response_format``: ``text`` (free), ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(OpenAIBody):
    """The fields completions and chat completions share."""

    model: StrictStr = ""
    """Empty: the served model."""
    max_tokens: JsonInt | None = Field(default=None, ge=1)
    temperature: float | None = None
    """None: 1 (OpenAI's default)."""
    top_p: float | None = None
    n: JsonInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, JSON keys being strings) -> bias."""
    seed: JsonInt | None = None
    """Any 64-bit integer; a negative one is taken modulo 2**64."""
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None
    """Ignored (OpenAI's abuse monitoring)."""
    # vLLM-style extensions
    top_k: JsonInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: JsonInt = Field(default=0, ge=0)
    stop_token_ids: list[JsonInt] | None = None
    ignore_eos: StrictBool = False
    cache_salt: StrictStr = ""
    prompt_logprobs: JsonInt | None = None
    prompt_cache_key: StrictStr | None = None
    """Scopes the pins ``prompt_cache_retention`` makes: a request's pin replaces the pin of
    the previous request with the same key (in its namespace). Routing needs no hint: every
    scheduler reads the one shared pool."""
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    """``24h``: the prompt is pinned for 24 hours (``zerolayer.frontend.prompt_cache``);
    ``in_memory`` or unset: cached while memory allows (LRU)."""
    prompt_cache_options: dict[str, Any] | None = None
    """``{"ttl": "30m", "mode": "implicit"}``: implicit mode pins the prompt for 30 minutes;
    explicit mode (breakpoints on content blocks) pins nothing."""


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: StrictStr | list[JsonInt] | list[StrictStr] | list[list[JsonInt]]
    """Text, or token ids; a list of several prompts is refused (no batches)."""
    logprobs: JsonInt | None = Field(default=None, ge=0)
    """Top alternatives per generated token (the chosen one always comes too)."""
    echo: StrictBool = False
    """Not implemented: true is refused."""
    suffix: StrictStr | None = None
    """Not implemented: set is refused."""
    best_of: JsonInt | None = None
    """Not implemented: above 1 is refused."""


class ContentPart(OpenAIBody):
    """One part of a message's content; only ``text`` and ``refusal`` parts are implemented."""

    model_config = ConfigDict(extra="allow")

    type: StrictStr
    text: StrictStr = ""
    refusal: StrictStr = ""
    """A ``refusal`` part's text (an assistant's earlier refusal)."""


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


class ChatMessageIn(OpenAIBody):
    """One message of ``messages``; an assistant message as the official client gives it back
    (``message.model_dump()``, its nulls included) is one."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    refusal: StrictStr = ""
    """An assistant's earlier refusal: its text, when it has no content."""
    annotations: list[dict[str, Any]] | None = None
    """Ignored (citations of an earlier answer)."""
    audio: dict[str, Any] | None = None
    """Not implemented (an earlier audio answer): set is refused."""
    function_call: dict[str, Any] | None = None
    """Not implemented: set is refused (null is the official client's echo)."""
    name: StrictStr = ""
    tool_call_id: StrictStr = ""
    tool_calls: list[ToolCallIn] | None = None
    """An assistant message's calls (its content may then be null)."""
    reasoning_content: StrictStr | None = None
    """An assistant message's thought (vLLM's field; templates such as Qwen3's render it)."""


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
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    """Takes the place of ``max_tokens`` (which OpenAI deprecates); both: this one."""
    logprobs: StrictBool = False
    top_logprobs: JsonInt | None = Field(default=None, ge=0, le=20)
    """Alternatives per token; needs ``logprobs``."""
    add_generation_prompt: StrictBool | None = None
    """vLLM's: end the rendered chat with the assistant's turn (None: yes)."""
    metadata: dict[str, StrictStr] | None = None
    """Ignored (tags for OpenAI's dashboard)."""
    store: StrictBool = False
    """Ignored (OpenAI keeps stored completions for its evals; nothing is kept here)."""
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    """Ignored (one tier here)."""
    safety_identifier: StrictStr | None = None
    """Ignored (OpenAI's abuse monitoring)."""
    modalities: list[Literal["text", "audio"]] | None = None
    """Only ``["text"]``: audio output is refused."""
    verbosity: Literal["low", "medium", "high"] | None = None
    """Ignored (a hint to OpenAI's models; use ``max_tokens`` to bound the answer)."""
    prediction: dict[str, Any] | None = None
    """Ignored (predicted output only makes OpenAI's answer faster, never different)."""
    web_search_options: dict[str, Any] | None = None
    """Not implemented (web search): set is refused."""
    audio: dict[str, Any] | None = None
    """Not implemented (audio output): set is refused."""
    moderation: dict[str, Any] | None = None
    """Not implemented (moderation of the answer): set is refused."""
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
