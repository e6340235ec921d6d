"""The server-sent events of a streamed message, as Anthropic sends them
(https://docs.anthropic.com/en/docs/build-with-claude/streaming): an ``event:`` line naming the
event and a ``data:`` line with its JSON (whose ``type`` is the same name).

Order: ``message_start`` (the message without content, the usage so far), then per content
block ``content_block_start``, its ``content_block_delta`` events (``thinking_delta``,
``text_delta`` or ``input_json_delta``) and ``content_block_stop`` (a ``ping`` after the first
``content_block_start``), then ``message_delta`` (``stop_reason``, ``stop_sequence``, the
usage) and ``message_stop``. An error once the stream has begun is an ``error`` event, last.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from zerolayer.common.generation import FinishReason, GenerationChunk, Usage
from zerolayer.frontend.anthropic.errors import error_of
from zerolayer.frontend.anthropic.response import (
    MessageHead,
    message_start_body,
    stop_reason,
    usage_body,
)

# NOTE: the seam's types (issue 30); after i30-tools merges: zerolayer.common.generation.
from zerolayer.frontend.http_call import CallRecord

Event = tuple[str, dict]
"""An event's name and its data."""


def sse(kind: str, body: dict) -> str:
    """One server-sent event named ``kind`` carrying ``body`` as JSON."""
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"


@dataclass
class MessageStreamEncoder:
    """Turns a stream's chunks (one sample) into its events, in order."""

    head: MessageHead
    _index: int = -1
    """The open content block's index; -1: none was opened yet."""
    _open: str = ""
    """The open block's type ("": none open)."""
    _tool_index: int = -1
    """Which call of the generation the open ``tool_use`` block is."""
    _usage: Usage | None = None

    def chunk(self, chunk: GenerationChunk) -> list[Event]:
        """The events of ``chunk`` (``message_start`` before the first one's).

        Raises:
            Unavailable: the generation was given up (see ``response.stop_reason``).
        """
        events: list[Event] = []
        if self._usage is None:
            start = message_start_body(self.head, chunk.usage)
            events.append(("message_start", {"type": "message_start", "message": start}))
        self._usage = chunk.usage or self._usage or Usage(0, 0, 0)
        if thought := chunk.reasoning_text:
            if self._open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": thought}))
        if chunk.text:
            if self._open != "text":
                events += self._start({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for delta in chunk.tool_call_deltas:
            if self._open != "tool_use" or delta.index != self._tool_index:
                block = {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}}
                events += self._start(block)
                self._tool_index = delta.index
            if delta.arguments:
                piece = {"type": "input_json_delta", "partial_json": delta.arguments}
                events.append(self._delta(piece))
        if chunk.finish_reason != FinishReason.UNSPECIFIED:
            events += self._end(chunk)
        return events

    def _end(self, chunk: GenerationChunk) -> list[Event]:
        reason, sequence = stop_reason(chunk.finish_reason, chunk.stop_string)
        events = self._start({"type": "text", "text": ""}) if self._index < 0 else []
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = ""
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        body = {
            "type": "message_delta",
            "delta": delta,
            "usage": usage_body(self._usage, self.head.pin_ttl_s),
        }
        return [*events, ("message_delta", body), ("message_stop", {"type": "message_stop"})]

    def _start(self, block: dict) -> list[Event]:
        """Closes the open block (if one) and opens ``block``."""
        events: list[Event] = []
        if self._open:
            events.append(
                ("content_block_stop", {"type": "content_block_stop", "index": self._index})
            )
        self._index += 1
        self._open = block["type"]
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        events.append(("content_block_start", start))
        if self._index == 0:
            events.append(("ping", {"type": "ping"}))
        return events

    def _delta(self, delta: dict) -> Event:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )


async def events(
    call: CallRecord,
    generation: AsyncIterator[GenerationChunk],
    first: GenerationChunk,
    encoder: MessageStreamEncoder,
) -> AsyncIterator[str]:
    """The events of a stream whose first chunk is ``first``; an error mid-stream is an
    ``error`` event, the last. Closing it closes ``generation`` (aborting the request) and ends
    ``call`` (CANCELLED when the client went first)."""
    code, error = "CANCELLED", ""
    try:
        try:
            for kind, body in encoder.chunk(first):
                yield sse(kind, body)
            while True:
                with call.current():
                    try:
                        chunk = await anext(generation)
                    except StopAsyncIteration:
                        break
                for kind, body in encoder.chunk(chunk):
                    yield sse(kind, body)
            code = "OK"
        except Exception as exc:  # noqa: BLE001 - the stream's status is sent already
            failed = error_of(exc)
            code, error = failed.grpc_code, failed.message
            yield sse("error", failed.body)
    finally:
        # NOTE: shielded: on a client's disconnect this runs in a cancelled task group, where
        # every await would be cancelled again before the scheduler call is ended.
        with anyio.CancelScope(shield=True):
            await generation.aclose()  # type: ignore[attr-defined]
        call.ended(200, code, error)
