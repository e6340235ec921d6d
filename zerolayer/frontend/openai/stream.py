"""The server-sent events of a streamed OpenAI-compatible response
(https://html.spec.whatwg.org/multipage/server-sent-events.html): ``data: <json>`` per chunk,
``data: [DONE]`` last."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio

from zerolayer.common.generation import GenerationChunk
from zerolayer.frontend.http_call import CallRecord
from zerolayer.frontend.openai.errors import error_of
from zerolayer.frontend.openai.response import StreamEncoder


def sse(body: dict | str) -> str:
    """One server-sent event carrying ``body`` (JSON, or a literal such as ``[DONE]``)."""
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n"


async def events(
    call: CallRecord,
    generation: AsyncIterator[GenerationChunk],
    first: GenerationChunk,
    encoder: StreamEncoder,
) -> AsyncIterator[str]:
    """The events of a stream whose first chunk is ``first``: one per chunk, the usage (when
    asked), ``[DONE]``; an error mid-stream is an event of OpenAI's error shape before
    ``[DONE]``. Closing it closes ``generation`` (aborting the request) and ends ``call``
    (CANCELLED when the client went first)."""
    code, error = "CANCELLED", ""
    try:
        try:
            yield sse(encoder.chunk(first))
            while True:
                with call.current():
                    try:
                        chunk = await anext(generation)
                    except StopAsyncIteration:
                        break
                yield sse(encoder.chunk(chunk))
            if (usage := encoder.usage()) is not None:
                yield sse(usage)
            code = "OK"
        except Exception as exc:  # noqa: BLE001 - the stream's status is sent already
            failed = error_of(exc, encoder.head.chat)
            code, error = failed.grpc_code, str(failed.body["error"]["message"])
            yield sse(failed.body)
        yield sse("[DONE]")
    finally:
        # NOTE: shielded: on a client's disconnect this runs in a cancelled task group, where
        # every await would be cancelled again before the scheduler call is ended.
        with anyio.CancelScope(shield=True):
            await generation.aclose()  # type: ignore[attr-defined]
        call.ended(200, code, error)
