"""The request bodies of the Anthropic Messages API, as pydantic models.

Anthropic's API reference: https://docs.anthropic.com/en/api/messages and
https://docs.anthropic.com/en/api/messages-count-tokens. Fields nobody defines are refused by
pydantic (``extra="forbid"``, as Anthropic answers "Extra inputs are not permitted"). A message's
content blocks are kept as JSON objects here and checked one by one, by their ``type``, in
``zerolayer.frontend.anthropic.params`` (so that an error names the block as
``messages.1.content.0.input``). ``cache_control`` (on the request, a tool, a system block or a
content block but ``thinking``) is checked here, and placed in the chat by
``zerolayer.frontend.anthropic.breakpoints``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
"""A tool's name (Anthropic's rule)."""


class CacheControl(BaseModel):
    """``cache_control``: ``{"type": "ephemeral", "ttl": "5m" | "1h"}``, a cache breakpoint
    (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"
    """How long the prefix up to the breakpoint stays cached: 5 minutes or an hour."""


class CacheControlled(BaseModel):
    """A block that may carry ``cache_control``."""

    model_config = ConfigDict(extra="forbid")

    cache_control: CacheControl | None = None


class TextBlock(CacheControlled):
    """``{"type": "text", "text": ...}``."""

    type: Literal["text"]
    text: StrictStr
    citations: list[dict[str, Any]] | None = None
    """Accepted and ignored (a model here cites nothing)."""


class ToolUseBlock(CacheControlled):
    """An assistant's call of a tool: ``{"type": "tool_use", "id", "name", "input"}``."""

    type: Literal["tool_use"]
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(pattern=TOOL_NAME_PATTERN)
    input: dict[str, Any]
    """The call's arguments (a JSON object)."""


class ToolResultBlock(CacheControlled):
    """A user's answer to a call: ``{"type": "tool_result", "tool_use_id", "content"}``."""

    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(min_length=1)
    content: StrictStr | list[TextBlock] = ""
    is_error: StrictBool = False
    """Accepted; a chat template has no place for it (the content says it)."""
    toolset_name: StrictStr | None = None
    """Accepted and ignored."""


class ThinkingBlock(BaseModel):
    """An assistant's earlier thought: ``{"type": "thinking", "thinking", "signature"}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr = ""
    """Anthropic's proof of origin; not checked (zerolayer signs nothing)."""


BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
}
"""The content blocks a message may hold, by ``type``; any other is refused."""


class MessageIn(BaseModel):
    """One message of ``messages``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: StrictStr | list[dict[str, Any]]
    """Text, or content blocks (see :data:`BLOCKS`)."""


class ToolIn(CacheControlled):
    """A client tool of ``tools`` (Anthropic's server tools, with another ``type``, are
    refused)."""

    type: Literal["custom"] | None = None
    name: StrictStr = Field(pattern=TOOL_NAME_PATTERN)
    description: StrictStr = ""
    input_schema: dict[str, Any]
    """The JSON schema of the tool's input."""
    strict: StrictBool = False
    """Accepted; the calls a tool-call parser returns are not checked against the schema."""
    defer_loading: Literal[False] = False
    """Anthropic's tool search loads such a tool later; here every tool is in the prompt."""
    allowed_callers: list[StrictStr] | None = None
    """Accepted and ignored (no server-side code execution here)."""
    eager_input_streaming: StrictBool | None = None
    """Accepted and ignored: a call's input streams as the model writes it."""
    input_examples: list[dict[str, Any]] | None = None
    """Accepted and ignored (a chat template has no place for them)."""


class ToolChoiceIn(BaseModel):
    """``tool_choice``: ``auto``, ``any`` (some tool), ``tool`` (the one named) or ``none``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr = ""
    """The tool, with ``type: "tool"``."""
    disable_parallel_tool_use: StrictBool = False
    """At most one call (``auto``) or exactly one (``any``, ``tool``)."""


class ThinkingIn(BaseModel):
    """``thinking``: whether the model reasons before it answers (``disabled``: no; any other
    type: yes; ``budget_tokens`` and ``display`` are accepted and not enforced)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: StrictInt | None = Field(default=None, ge=1)
    display: Literal["summarized", "omitted"] | None = None


class Metadata(BaseModel):
    """``metadata``: accepted; ``user_id`` is Anthropic's abuse monitoring, ignored here."""

    model_config = ConfigDict(extra="forbid")

    user_id: StrictStr | None = None


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens``: what a ``POST /v1/messages`` would render."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    messages: list[MessageIn] = Field(min_length=1)
    system: StrictStr | list[TextBlock] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
    cache_control: CacheControl | None = None
    """Automatic caching: a breakpoint on the last message's last block."""
    speed: Literal["standard", "fast"] | None = None
    """Accepted and ignored (one speed here)."""
    user_profile_id: StrictStr | None = None
    """Accepted and ignored (Anthropic's accounts)."""
    workspace_id: StrictStr | None = None
    """Accepted and ignored (Anthropic's accounts)."""
    output_config: dict[str, Any] | None = None
    """Not implemented: set is refused."""


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: list[StrictStr] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    """None: 1 (Anthropic's default)."""
    top_p: float | None = None
    top_k: StrictInt | None = None
    metadata: Metadata | None = None
    stream: StrictBool = False
    service_tier: Literal["auto", "standard_only"] | None = None
    """Accepted and ignored (one tier here)."""
    inference_geo: StrictStr | None = None
    """Accepted and ignored (it runs where it runs)."""
    container: Any = None
    """Not implemented (no server-side code execution): set is refused."""
