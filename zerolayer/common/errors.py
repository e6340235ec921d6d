"""Typed domain errors and the one place that maps them to gRPC status codes.

Domain code raises these; :class:`ErrorMappingInterceptor` turns them into a gRPC status whose
message names the offending field, so handlers never build statuses themselves.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)


class ZerolayerError(Exception):
    """Base class: an error with a gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(ZerolayerError):
    """A request field is invalid. The message starts with the field name."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class NotFound(ZerolayerError):
    """A named thing (model, request) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ZerolayerError):
    """Not enough of a resource (KV blocks, queue slots) right now."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ZerolayerError):
    """A layer this request needs is down or not serving."""

    code = grpc.StatusCode.UNAVAILABLE


class FailedPrecondition(ZerolayerError):
    """The system is not in a state where the call can run (e.g. arena geometry mismatch)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


ANSWERED_METADATA = ("zerolayer-answered-by-handler", "1")
"""Trailing metadata of a status a handler chose (a domain error), so that a caller can tell
"the layer answered UNAVAILABLE" (e.g. the scheduler: its kvstore is down) from "the layer could
not be reached" (worth retrying while it restarts)."""


def answered_by_handler(exc: grpc.RpcError) -> bool:
    """True when the status of ``exc`` came from a zerolayer handler (see ANSWERED_METADATA)."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return ANSWERED_METADATA in tuple(trailing or ())


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, ZerolayerError):
        await context.abort(exc.code, str(exc), trailing_metadata=(ANSWERED_METADATA,))
    if isinstance(exc, grpc.aio.AioRpcError):
        # An upstream layer failed: pass UNAVAILABLE through, anything else is internal.
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            await context.abort(code, f"upstream layer: {exc.details()}")
        if code in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.CANCELLED,
        ):
            await context.abort(code, exc.details() or "")
    log.exception("unexpected error in handler")
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _wrap_unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise  # the status is already sent (e.g. a request that did not parse)
        except (ZerolayerError, grpc.aio.AioRpcError) as exc:
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001 - the interceptor is the last line
            await _abort(context, exc)

    return handler


def _wrap_stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in fn(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except (ZerolayerError, grpc.aio.AioRpcError) as exc:
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001
            await _abort(context, exc)

    return handler


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps :class:`ZerolayerError` (and upstream gRPC errors) raised by handlers to statuses.

    Only unary-unary and unary-stream handlers are wrapped: the kinds zerolayer's own services
    use. Methods outside ``prefix`` (health, reflection) pass through untouched.
    """

    def __init__(self, prefix: str = "/zerolayer.") -> None:
        self._prefix = prefix

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefix):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


class _Unparsable:
    """Stands in for a request message whose bytes did not parse; no handler ever sees one."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _parsing(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    type_name = getattr(descriptor, "full_name", "the method's request message")

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            reason = str(exc).rsplit(": ", 1)[-1]
            log.warning(
                "%s: %d request bytes are not a %s (%s)", method, len(data), type_name, reason
            )
            return _Unparsable(f"request: could not be parsed as {type_name}: {reason}")

    return deserialize


async def _refuse_unparsable(request: Any, context: grpc.aio.ServicerContext) -> Any:
    if isinstance(request, _Unparsable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
    return request


async def _refusing_unparsable(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    async for request in requests:
        yield await _refuse_unparsable(request, context)


def _checked(fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any] | None:
    """``fn`` behind a check that refuses requests that did not parse; None for a kind of
    handler it cannot wrap (synchronous ones)."""

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request_streaming:
            return _refusing_unparsable(request, context)
        return await _refuse_unparsable(request, context)

    if inspect.isasyncgenfunction(fn):

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
            async with aclosing(fn(await checked(request, context), context)) as items:
                async for item in items:
                    yield item

        return generator
    if inspect.iscoroutinefunction(fn):
        # NOTE: also the reader-writer form of streaming handlers (health's Watch writes with
        # context.write), which must stay a coroutine function.
        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await fn(await checked(request, context), context)

        return coroutine
    return None


_HANDLER_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Answers INVALID_ARGUMENT ("request: could not be parsed as zerolayer.v1.GenerateRequest:
    ...") to a request message that is not valid protobuf of the method's type (bad wire format,
    truncation, invalid UTF-8 in a string field), with one WARNING log line and no traceback.

    gRPC parses requests before any handler or interceptor runs, and answers a parse error with
    UNKNOWN and a logged traceback. This interceptor swaps in a deserializer that marks such a
    request instead, and a handler that refuses it: placed innermost, the interceptors outside it
    (request counting, tracing) see the refusal as a call that ended with ``context.abort``. In a
    request stream, the first message that does not parse ends the call. Every method is covered.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        streaming = (handler.request_streaming, handler.response_streaming)
        attribute, make_handler = _HANDLER_KINDS[streaming]
        checked = _checked(getattr(handler, attribute), handler.request_streaming)
        if checked is None:
            return handler
        return make_handler(
            checked,
            request_deserializer=_parsing(
                handler.request_deserializer, handler_call_details.method
            ),
            response_serializer=handler.response_serializer,
        )
