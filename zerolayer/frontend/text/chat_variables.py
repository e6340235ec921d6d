"""What a chat template sees of a request: its messages, tools and further variables, in the
shapes transformers documents for templates
(https://huggingface.co/docs/transformers/main/en/chat_extras).

``tools`` is a list of ``{"type": "function", "function": {"name", "description", "parameters"}}``
(the schema a dict); an assistant message's ``tool_calls`` a list of ``{"id", "type":
"function", "function": {"name", "arguments"}}`` with ``arguments`` a dict (templates write it
with ``tojson``; a text that is not a JSON object stays text); a tool message carries
``tool_call_id``; an assistant message's ``reasoning_content`` is given when set. Keys that are
unset are left out, as transformers drops keys whose value is None.
"""

from __future__ import annotations

import json
from typing import Any

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage, ToolDefinition

RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt")
"""Variables the renderer sets itself: ``chat_template_kwargs`` cannot set them."""


def template_kwargs(chat_template_kwargs_json: str) -> dict[str, Any]:
    """The further template variables of a request's ``chat_template_kwargs_json`` ("": none).

    Raises:
        InvalidArgument: ``chat_template_kwargs``: not a JSON object, or setting one of
            :data:`RESERVED_TEMPLATE_VARIABLES`.
    """
    if not chat_template_kwargs_json:
        return {}
    try:
        value = json.loads(chat_template_kwargs_json)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidArgument("chat_template_kwargs", "not JSON") from None
    if not isinstance(value, dict):
        raise InvalidArgument("chat_template_kwargs", "must be a JSON object")
    reserved = sorted(set(value) & set(RESERVED_TEMPLATE_VARIABLES))
    if reserved:
        raise InvalidArgument("chat_template_kwargs", f"cannot set {', '.join(reserved)}")
    return value


def tool_dict(tool: ToolDefinition) -> dict[str, Any]:
    """A tool as templates take it: ``{"type": "function", "function": {"name",
    "description" (when set), "parameters"}}``.

    Raises:
        ValueError: ``parameters_json`` is not JSON (checked before: tool_request).
    """
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(tool.parameters_json)
    return {"type": "function", "function": function}


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """``message`` as templates take it (see the module docstring)."""
    fields: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        fields["name"] = message.name
    if message.tool_call_id:
        fields["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        fields["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.reasoning_content:
        fields["reasoning_content"] = message.reasoning_content
    return fields


def _arguments(arguments: str) -> Any:
    """A call's arguments as templates expect them: the JSON object as a dict (vLLM and SGLang
    do the same for OpenAI's JSON text), other text as is."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # NOTE: ValueError: also an integer over 4300 digits
        return arguments
    return value if isinstance(value, dict) else arguments
