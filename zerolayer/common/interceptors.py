"""The one way zerolayer's server interceptors wrap handlers.

An interceptor says *what* it does around a call (a :class:`Wrapping`: an async context manager
around the whole call, a check of each request message, a replacement deserializer);
:func:`wrap_handler` applies it to whichever of gRPC's four handler kinds the method has
(unary-unary, unary-stream, stream-unary, stream-stream) and rebuilds the
``grpc.RpcMethodHandler``. Error mapping, the refusal of requests that do not parse, tracing and
request counting are all written this way, so every kind of method gets every one of them.

How grpc.aio runs a handler (and so how it is wrapped) depends on what the handler function is:
an async generator function answers with the messages it yields; a coroutine function answers
with what it returns, or, for a response stream, writes with ``context.write`` (the reader-writer
form, e.g. health's ``Watch``); a plain function runs in gRPC's thread pool and is left unwrapped.
A wrapped response stream is always written by the wrapper itself, with ``context.write`` (see
:func:`_write`).
Source: grpc.aio server (``_handle_*_rpc`` in grpc/_cython/_cygrpc/aio/server.pyx.pxi).
"""

from __future__ import annotations

import abc
import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, aclosing, nullcontext
from dataclasses import dataclass
from typing import Any

import grpc
from grpc._cython import cygrpc  # ExecuteBatchError: grpc.aio has no public name for it

Around = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[Any]]
"""Given the call's context, an async context manager entered for the whole call: around the
awaited handler, or around every message of a response stream and its writing until it ends.
A call that is cancelled, past its deadline, or whose message could not be sent because it is
over, raises ``asyncio.CancelledError`` inside it."""
Prepare = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
"""Given one request message and the context, the message the handler gets (it may abort)."""


@dataclass(frozen=True)
class Wrapping:
    """What an interceptor does to one method's calls; each part is optional."""

    around: Around | None = None
    prepare: Prepare | None = None
    """Applied to the request, or to each message of a request stream as the handler reads it
    (inside ``around``)."""
    request_deserializer: Callable[[bytes], Any] | None = None
    """Replaces the method's deserializer (None keeps it)."""


_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def wrap_handler(handler: grpc.RpcMethodHandler, wrapping: Wrapping) -> grpc.RpcMethodHandler:
    """``handler`` with ``wrapping`` applied, as a new handler of the same kind.

    Args:
        handler: the method's handler, of any of the four kinds.
        wrapping: what to do around its calls.

    Returns:
        The rebuilt handler (same kind, same response serializer), or ``handler`` itself when its
        function is synchronous (gRPC runs those in a thread; none of zerolayer's are).
    """
    attribute, make_handler = _KINDS[(handler.request_streaming, handler.response_streaming)]
    function = getattr(handler, attribute)
    if inspect.isasyncgenfunction(function):
        wrapped = _wrapped_stream(function, wrapping, handler.request_streaming)
    elif inspect.iscoroutinefunction(function):
        wrapped = _wrapped_call(function, wrapping, handler.request_streaming)
    else:
        return handler
    return make_handler(
        wrapped,
        request_deserializer=wrapping.request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _no_context(context: grpc.aio.ServicerContext) -> AbstractAsyncContextManager[Any]:
    return nullcontext()


def _wrapped_call(
    function: Callable[..., Awaitable[Any]], wrapping: Wrapping, request_streaming: bool
) -> Callable[..., Awaitable[Any]]:
    around = wrapping.around or _no_context

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with around(context):
            request = await _prepared(request, context, wrapping.prepare, request_streaming)
            return await function(request, context)

    return call


def _wrapped_stream(
    function: Callable[..., AsyncIterator[Any]], wrapping: Wrapping, request_streaming: bool
) -> Callable[..., Awaitable[None]]:
    """An async generator handler as a reader-writer one (a coroutine that writes each message),
    so that a failed write happens, and is handled, inside the wrapping (see :func:`_write`)."""
    around = wrapping.around or _no_context

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> None:
        async with around(context):
            request = await _prepared(request, context, wrapping.prepare, request_streaming)
            # NOTE: closed here, not whenever it is collected, so the handler's own cleanup (e.g.
            # aborting the generation of a client that left) runs before the call ends.
            async with aclosing(function(request, context)) as items:
                async for item in items:
                    await _write(context, item)

    return stream


async def _write(context: grpc.aio.ServicerContext, message: Any) -> None:
    """``context.write(message)``; a send that fails ends the call as a cancellation.

    A server's send fails only once the call is over in gRPC's core: the client cancelled it (or
    its deadline passed) while the message waited, e.g. on flow control for a client that
    stopped reading, or the server is stopping. No status can be sent any more. Written by
    gRPC's own loop (an async generator handler), that failure raced with gRPC noticing the
    cancellation, and lost in about a third of such calls: an ERROR traceback
    "ExecuteBatchError raised in core" in the log. Raised here as the cancellation it is, it
    closes the handler's generator and is counted, traced and logged as one.

    Raises:
        asyncio.CancelledError: the message could not be sent (from cygrpc.ExecuteBatchError).
    """
    try:
        await context.write(message)
    except cygrpc.ExecuteBatchError as exc:
        raise asyncio.CancelledError(f"call over, message not sent: {exc}") from exc


async def _prepared(
    request: Any, context: grpc.aio.ServicerContext, prepare: Prepare | None, streaming: bool
) -> Any:
    if prepare is None:
        return request
    if streaming:
        return _each_prepared(request, context, prepare)
    return await prepare(request, context)


async def _each_prepared(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, prepare: Prepare
) -> AsyncIterator[Any]:
    async for request in requests:
        yield await prepare(request, context)


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that wraps the handlers of the methods it covers with
    :func:`wrap_handler`; subclasses say how in :meth:`wrapping`."""

    def __init__(self, prefixes: tuple[str, ...] = ("/",)) -> None:
        """
        Args:
            prefixes: the full method names covered start with one of these (e.g.
                ``"/zerolayer."``); the default covers every method of every service.
        """
        self._prefixes = prefixes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefixes):
            return handler
        wrapping = self.wrapping(handler, handler_call_details)
        return handler if wrapping is None else wrap_handler(handler, wrapping)

    @abc.abstractmethod
    def wrapping(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Wrapping | None:
        """What to do around the calls of ``details.method`` (None: leave them alone); each
        interceptor says (grpc.aio.ServerInterceptor is an ABC: one that does not cannot be
        made)."""
