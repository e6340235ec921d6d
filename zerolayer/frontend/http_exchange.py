"""One exchange of a public HTTP API (OpenAI's, Anthropic's): reading its JSON body within a
limit, watching for its client's disconnect while the answer is made, and a streamed answer that
ends its generation however the stream ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from zerolayer.common.generation import GenerationChunk
from zerolayer.frontend.http_call import CallRecord
from zerolayer.frontend.unicode_text import check_unicode

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Default largest request body, bytes (the gRPC port's limit is the same)."""
DISCONNECT_POLL_S = 0.5
"""How often a request waiting for its whole response, or for a stream's first chunk, looks
whether its client is still there, seconds (a stream that has started learns it at once:
Starlette listens for the disconnect while it sends)."""


async def read_json(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    """The request's JSON body as ``model``.

    Raises:
        BodyTooLarge: over ``max_bytes`` (said by its Content-Length, or found while reading).
        ValueError: not JSON (``json.JSONDecodeError``, not UTF-8, nested too deeply).
        ValidationError: not a valid ``model``.
        InvalidArgument: a string that is not Unicode text (a lone surrogate), naming its field.
    """
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > max_bytes:
        raise BodyTooLarge(max_bytes)
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > max_bytes:
            raise BodyTooLarge(max_bytes)
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    check_unicode(value)
    return model.model_validate(value)


PIN_REFUSAL_HEADER = "zerolayer-pin-refusal"
"""The response header that says why a pin the request asked for was not made
(``Usage.pin_refusal``: ``pin-over-budget``, ``pin-over-namespace-budget``, ``pin-nothing-cached``,
``pin-kvstore-unavailable``): the request ran, and nothing was written to the cache for it."""


def pin_refusal_headers(refusal: str) -> dict[str, str]:
    """``zerolayer-pin-refusal: <refusal>``, or nothing for "" (no pin refused)."""
    return {PIN_REFUSAL_HEADER: refusal} if refusal else {}


def generation_refusal(chunks: list[GenerationChunk]) -> str:
    """The pin refusal of a whole generation (its last usage's; "": none)."""
    usage = next((c.usage for c in reversed(chunks) if c.usage is not None), None)
    return usage.pin_refusal if usage is not None else ""


class BodyTooLarge(ValueError):
    """A request body over the limit."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"request body: over {max_bytes} bytes")


class ClientGone(Exception):
    """The client disconnected before its (whole) response was ready."""


async def unless_disconnected(request: Request, task: asyncio.Future[Any]) -> Any:
    """The result of ``task``; checked for the client's disconnect every DISCONNECT_POLL_S
    while it runs (it is then cancelled: cancelling a generation aborts it in the scheduler).

    Raises:
        ClientGone: the client disconnected first.
        Exception: what ``task`` raised.
    """
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                raise ClientGone
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def whole_generation(
    request: Request, call: CallRecord, generation: AsyncGenerator[GenerationChunk, None]
) -> list[GenerationChunk]:
    """Every chunk of ``generation``, in the call's span, unless the client goes first.

    Raises:
        ClientGone: the client disconnected first (the generation is then aborted).
        Exception: what the generation raised.
    """

    async def collect() -> list[GenerationChunk]:
        with call.current():
            return [chunk async for chunk in generation]

    try:
        return await unless_disconnected(request, asyncio.ensure_future(collect()))
    finally:
        await generation.aclose()


async def first_chunk(
    request: Request, call: CallRecord, generation: AsyncGenerator[GenerationChunk, None]
) -> GenerationChunk:
    """The first chunk of ``generation``, in the call's span, unless the client goes first; a
    stream's headers wait for it, so that a request refused by validation (or with no
    scheduler) gets its error status, not a 200 stream holding an error.

    Raises:
        ClientGone: the client disconnected first.
        Exception: what the generation raised.
        (Either way the generation is closed: aborted.)
    """

    async def first() -> GenerationChunk:
        with call.current():
            return await anext(generation)

    try:
        return await unless_disconnected(request, asyncio.ensure_future(first()))
    except BaseException:
        await generation.aclose()
        raise


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends (Starlette
    leaves it to the garbage collector when sending fails)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
