"""Typed domain errors and the one place that maps them to gRPC status codes.

Domain code raises these; :class:`ErrorMappingInterceptor` turns them into a gRPC status whose
message names the offending field, so handlers never build statuses themselves.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

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


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, ZerolayerError):
        await context.abort(exc.code, str(exc))
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
