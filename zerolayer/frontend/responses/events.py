"""A generation's chunks to the Responses API's stream events, in order, each with its
``sequence_number`` (https://platform.openai.com/docs/api-reference/responses-streaming).

``response.created``, ``response.in_progress``; then per output item ``response.output_item.added``
and its content: a reasoning item's ``response.content_part.added`` (``reasoning_text``),
``response.reasoning_text.delta``... ``.done``; a message's ``response.content_part.added``
(``output_text``), ``response.output_text.delta``... ``response.output_text.done``,
``response.content_part.done``; a function call's ``response.function_call_arguments.delta``...
``.done``; each item ends with ``response.output_item.done``. Last: ``response.completed``
(``response.incomplete`` at the token limit, ``response.failed`` when given up).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zerolayer.common.generation import FinishReason, GenerationChunk
from zerolayer.frontend.responses.output import (
    ResponseHead,
    function_call_item,
    message_item,
    new_item_id,
    output_text_part,
    reasoning_item,
    response_body,
    status_of,
    usage_body,
)
from zerolayer.frontend.responses.seam import ToolCall, ToolCallDelta, chunk_parts


@dataclass
class _OpenItem:
    """The output item being streamed."""

    kind: str
    """"reasoning", "message" or "function_call"."""
    item_id: str
    output_index: int
    text: str = ""
    """The text or the arguments so far."""
    call: ToolCall | None = None
    call_index: int = -1


@dataclass
class ResponseEvents:
    """Turns one response's chunks into its events; :meth:`start` first, :meth:`chunk` per
    chunk, the last one's events end with the whole response."""

    head: ResponseHead
    output: list[dict] = field(default_factory=list)
    """The items done so far (the whole response's ``output`` once it ended)."""
    final: dict | None = None
    """The whole response object, once the last chunk came."""
    _sequence_number: int = 0
    _open: _OpenItem | None = None
    _num_reasoning_tokens: int = 0

    def start(self) -> list[dict]:
        """``response.created`` and ``response.in_progress``."""
        body = response_body(self.head, "in_progress", [], None)
        return [
            self._event("response.created", response=body),
            self._event("response.in_progress", response=body),
        ]

    def chunk(self, chunk: GenerationChunk) -> list[dict]:
        """The events of ``chunk``; on the last, the open item's end and the final event."""
        text, reasoning, deltas = chunk_parts(chunk)
        events = []
        if reasoning:
            events += self._delta("reasoning", reasoning)
            if not text and not deltas:
                self._num_reasoning_tokens += len(chunk.token_ids)
        if text:
            events += self._delta("message", text)
        for delta in deltas:
            events += self._call_delta(delta)
        if chunk.finish_reason != FinishReason.UNSPECIFIED:
            events += self._finish(chunk)
        return events

    def error(self, code: str, message: str, param: str | None) -> dict:
        """An ``error`` event (the stream then ends)."""
        return self._event("error", code=code, message=message, param=param)

    def _delta(self, kind: str, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._close("completed")
            events += self._open_item(kind, None)
        assert self._open is not None
        self._open.text += text
        where = self._where(self._open)
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", **where, delta=text))
        else:
            events.append(
                self._event("response.output_text.delta", **where, delta=text, logprobs=[])
            )
        return events

    def _call_delta(self, delta: ToolCallDelta) -> list[dict]:
        events = []
        if self._open is None or self._open.call_index != delta.index:
            events += self._close("completed")
            events += self._open_item("function_call", ToolCall(delta.id, delta.name, ""))
            assert self._open is not None
            self._open.call_index = delta.index
        assert self._open is not None
        if delta.arguments:
            self._open.text += delta.arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._open.item_id,
                    output_index=self._open.output_index,
                    delta=delta.arguments,
                )
            )
        return events

    def _open_item(self, kind: str, call: ToolCall | None) -> list[dict]:
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = _OpenItem(kind, new_item_id(prefix), len(self.output), call=call)
        self._open = item
        events = [
            self._event(
                "response.output_item.added",
                output_index=item.output_index,
                item=self._item(item, "in_progress", ""),
            )
        ]
        if kind != "function_call":
            part = (
                {"type": "reasoning_text", "text": ""}
                if kind == "reasoning"
                else (output_text_part(""))
            )
            events.append(
                self._event("response.content_part.added", **self._where(item), part=part)
            )
        return events

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        events = []
        where = self._where(item)
        if item.kind == "reasoning":
            events.append(self._event("response.reasoning_text.done", **where, text=item.text))
            part = {"type": "reasoning_text", "text": item.text}
            events.append(self._event("response.content_part.done", **where, part=part))
        elif item.kind == "message":
            events.append(
                self._event("response.output_text.done", **where, text=item.text, logprobs=[])
            )
            part = output_text_part(item.text)
            events.append(self._event("response.content_part.done", **where, part=part))
        else:
            assert item.call is not None
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    name=item.call.name,
                    arguments=item.text,
                )
            )
        done = self._item(item, status, item.text)
        self.output.append(done)
        events.append(
            self._event("response.output_item.done", output_index=item.output_index, item=done)
        )
        return events

    def _finish(self, chunk: GenerationChunk) -> list[dict]:
        status = status_of(chunk.finish_reason)
        item_status = "completed" if status == "completed" else "incomplete"
        events = []
        if self._open is None and not self.output:
            events += self._open_item("message", None)  # an empty answer is still a message
        events += self._close(item_status)
        usage = usage_body(chunk.usage, self._num_reasoning_tokens)
        self.final = response_body(self.head, status, self.output, usage)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
        events.append(self._event(kind.get(status, "response.failed"), response=self.final))
        return events

    @staticmethod
    def _item(item: _OpenItem, status: str, text: str) -> dict:
        if item.kind == "reasoning":
            return reasoning_item(item.item_id, text, status)
        if item.kind == "message":
            return message_item(item.item_id, text if status != "in_progress" else None, status)
        assert item.call is not None
        call = ToolCall(item.call.id, item.call.name, text)
        return function_call_item(item.item_id, call, status)

    @staticmethod
    def _where(item: _OpenItem) -> dict:
        return {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}

    def _event(self, kind: str, **fields: object) -> dict:
        event = {"type": kind, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return event
