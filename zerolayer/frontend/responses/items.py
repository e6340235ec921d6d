"""A conversation's items (OpenAI's Responses input and output items) to chat messages.

Shapes: https://platform.openai.com/docs/api-reference/responses/create (``input``). Messages keep
their role (``developer`` is the chat templates' ``system``); ``function_call`` items join the
assistant message they follow (or make one) as its ``tool_calls``; a ``function_call_output``
is a ``tool`` message answering its ``call_id``; a ``reasoning`` item's text is the next assistant
message's ``reasoning_content``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from zerolayer.common.errors import InvalidArgument
from zerolayer.frontend.responses.schema import (
    ITEMS,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
    ReasoningItem,
)
from zerolayer.frontend.responses.seam import ChatMessage, ToolCall, needs_tools

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
"""Content parts read as text; any other (images, files, refusals) is refused."""


class ItemError(InvalidArgument):
    """An input item that is not one zerolayer serves; ``field`` is OpenAI's (``input[2].role``)."""


def parse_items(raw: str | list[dict[str, Any]]) -> tuple[dict, ...]:
    """The input items of ``input``: a text is one user message; each item is checked and
    returned as sent (a message without ``type`` gets ``type: "message"``).

    Raises:
        ItemError: an item of a type not served, or not of its type's shape; names the field.
    """
    if isinstance(raw, str):
        return ({"type": "message", "role": "user", "content": raw},)
    items = []
    for index, item in enumerate(raw):
        kind = item.get("type", "message")
        model = ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise ItemError(f"input[{index}].type", f"{str(kind)[:64]!r} items are not supported")
        try:
            model.model_validate(item)
        except ValidationError as exc:
            raise ItemError(_field(f"input[{index}]", exc), _reason(exc)) from None
        items.append({**item, "type": kind})
    return tuple(items)


def chat_messages(
    conversation: Sequence[dict], instructions: str | None, num_stored: int
) -> tuple[ChatMessage, ...]:
    """The chat messages of ``conversation`` (items that :func:`parse_items` checked, or that
    a stored response put out), after a system message of ``instructions`` if any.

    Args:
        num_stored: how many leading items come from the stored responses (an error in a later
            one names ``input[i - num_stored]``).

    Raises:
        ItemError: a non-text content part, a function call while the build has no tool calling,
            or a ``function_call_output`` whose ``call_id`` no earlier ``function_call`` has.
    """
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage("system", instructions))
    call_ids: set[str] = set()
    reasoning = ""
    for index, raw in enumerate(conversation):
        field = f"input[{index - num_stored}]"
        item: Item = ITEMS[raw["type"]].model_validate(raw)  # type: ignore[assignment]
        if isinstance(item, ReasoningItem):
            reasoning += _text([*item.summary, *(item.content or ())], f"{field}.summary")
        elif isinstance(item, MessageItem):
            content = item.content
            if not isinstance(content, str):
                content = _text(content, f"{field}.content")
            role = "system" if item.role == "developer" else item.role
            # NOTE: the reasoning that led to an answer goes with it (templates that show
            # past thoughts render it; the others drop it).
            thought, reasoning = (reasoning, "") if role == "assistant" else ("", reasoning)
            messages.append(ChatMessage(role, content, reasoning_content=thought))
        elif isinstance(item, FunctionCallItem):
            needs_tools(field)
            call_ids.add(item.call_id)
            call = ToolCall(item.call_id, item.name, item.arguments)
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.role == "assistant"
                and _follows_assistant(conversation, index)
            ):
                messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
            if reasoning:
                messages[-1] = replace(messages[-1], reasoning_content=reasoning)
                reasoning = ""
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                reason = f"no function_call has call_id {item.call_id[:64]!r}"
                raise ItemError(f"{field}.call_id", reason)
            needs_tools(field)
            output = item.output
            if not isinstance(output, str):
                output = _text(output, f"{field}.output")
            messages.append(ChatMessage("tool", output, tool_call_id=item.call_id))
    return tuple(messages)


def _follows_assistant(conversation: Sequence[dict], index: int) -> bool:
    """The item before ``index`` is an assistant message or a function call."""
    if index == 0:
        return False
    before = conversation[index - 1]
    return before["type"] == "function_call" or (
        before["type"] == "message" and before.get("role") == "assistant"
    )


def _text(parts: Sequence[ContentPart], field: str) -> str:
    for i, part in enumerate(parts):
        if part.type not in TEXT_PARTS:
            raise ItemError(f"{field}[{i}].type", f"{part.type[:64]!r} parts are not supported")
    return "".join(part.text for part in parts)


def _field(prefix: str, exc: ValidationError) -> str:
    """OpenAI's name of the field pydantic's first error is about (``input[0].content``)."""
    field = prefix
    for part in exc.errors(include_url=False)[0]["loc"]:
        if isinstance(part, int):
            field += f"[{part}]"
        elif part in ("str", "list[ContentPart]") or "[" in part:
            break  # pydantic names the member of a union it tried
        else:
            field += f".{part}"
    return field


def _reason(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    return "unrecognized field" if first["type"] == "extra_forbidden" else first["msg"]


def with_id(item: dict, item_id: str) -> dict:
    """An input item as a stored response lists it (``GET .../input_items``): its ``id``
    (``item_id`` unless it has one), a message's text content as one ``input_text`` part
    (``output_text`` for an assistant's) and its ``status``."""
    listed = {"id": item_id, **item}
    if item["type"] == "message":
        listed.setdefault("status", "completed")
        if isinstance(item["content"], str):
            kind = "output_text" if item["role"] == "assistant" else "input_text"
            listed["content"] = [{"type": kind, "text": item["content"]}]
    return listed
