"""The request body of ``POST /v1/responses`` and its input items, as pydantic models.

OpenAI's reference: https://platform.openai.com/docs/api-reference/responses/create (the
``CreateResponse`` schema of its OpenAPI document). Fields nobody defines are refused
(``extra="forbid"``, as OpenAI answers "Unknown parameter"); fields OpenAI defines that zerolayer
does not implement are declared so that setting them is refused naming the field
(``zerolayer.frontend.responses.request``); metadata-only fields are accepted and echoed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextFormat(Strict):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat: name and schema
    beside the type, unlike chat's ``response_format``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr = ""
    description: StrictStr = ""
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextParam(Strict):
    """``text``."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """Accepted and echoed (no model here reads it)."""


class ReasoningParam(Strict):
    """``reasoning``: accepted; ``effort`` is passed to the chat template as
    ``reasoning_effort`` once reasoning is in the build."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class FunctionTool(Strict):
    """One ``tools`` entry: a function (the only kind served)."""

    type: Literal["function"]
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ContentPart(BaseModel):
    """A part of a message's content; only text parts (``input_text``, ``output_text``) are
    served, the others refused naming their ``type`` (``zerolayer.frontend.responses.items``)."""

    model_config = ConfigDict(extra="allow")

    type: StrictStr
    text: StrictStr = ""
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(Strict):
    """A message: ``EasyInputMessage``, ``InputMessage`` or an echoed ``OutputMessage``."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[ContentPart]
    id: StrictStr | None = None
    status: StrictStr | None = None
    phase: Any = None


class FunctionCallItem(Strict):
    """A call the model made (``function_call``), sent back with the conversation."""

    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr
    id: StrictStr | None = None
    status: StrictStr | None = None
    namespace: StrictStr | None = None


class FunctionCallOutputItem(Strict):
    """The result of a call (``function_call_output``): text, or text parts."""

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1)
    output: StrictStr | list[ContentPart]
    id: StrictStr | None = None
    status: StrictStr | None = None


class ReasoningItem(Strict):
    """A reasoning item echoed back: its ``summary`` and ``content`` texts."""

    type: Literal["reasoning"]
    id: StrictStr | None = None
    summary: list[ContentPart] = []
    content: list[ContentPart] | None = None
    encrypted_content: StrictStr | None = None
    status: StrictStr | None = None


ITEMS: dict[str, type[Strict]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
"""The input items served, by ``type`` (a message may leave ``type`` out)."""
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class CreateResponseRequest(Strict):
    """``POST /v1/responses``."""

    model: StrictStr = ""
    """Empty: the served model."""
    input: StrictStr | list[dict[str, Any]] | None = None
    """Text (one user message) or items; the items are checked by
    ``zerolayer.frontend.responses.items``."""
    instructions: StrictStr | None = None
    """The system message, first; not carried to the next turn by ``previous_response_id``."""
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    """None: 1 (OpenAI's default)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: TextParam | None = None
    reasoning: ReasoningParam | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    """A mode, or ``{"type": "function", "name": ...}``."""
    parallel_tool_calls: StrictBool | None = None
    max_tool_calls: StrictInt | None = None
    """Accepted and echoed."""
    store: StrictBool | None = None
    """None: true (OpenAI's default)."""
    previous_response_id: StrictStr | None = None
    metadata: dict[StrictStr, StrictStr] | None = Field(default=None, max_length=16)
    stream: StrictBool | None = None
    stream_options: dict[str, Any] | None = None
    """Accepted (``include_obfuscation``: no obfuscation is sent)."""
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: StrictStr | None = None
    service_tier: StrictStr | None = None
    include: list[StrictStr] | None = None
    """Accepted; nothing more is included."""
    truncation: Literal["disabled", "auto"] | None = None
    """Not implemented: "auto" is refused."""
    background: StrictBool | None = None
    """Not implemented: true is refused."""
    top_logprobs: StrictInt | None = None
    """Not implemented: above 0 is refused."""
    conversation: Any = None
    """Not implemented (OpenAI's Conversations API): set is refused."""
    prompt: Any = None
    """Not implemented (OpenAI's stored prompts): set is refused."""
