"""Refusal of request messages that are not valid protobuf of their method's type."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from zerolayer.common.interceptors import Wrapping, WrappingInterceptor

log = logging.getLogger(__name__)


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


class MalformedRequestInterceptor(WrappingInterceptor):
    """Answers INVALID_ARGUMENT ("request: could not be parsed as zerolayer.v1.GenerateRequest:
    ...") to a request message that is not valid protobuf of the method's type (bad wire format,
    truncation, invalid UTF-8 in a string field), with one WARNING log line and no traceback.

    gRPC parses requests before any handler or interceptor runs, and answers a parse error with
    UNKNOWN and a logged traceback. This interceptor swaps in a deserializer that marks such a
    request instead, and a check that refuses it: placed innermost, the interceptors outside it
    (request counting, tracing) see the refusal as a call that ended with ``context.abort``. In a
    request stream, the first message that does not parse ends the call. Every method is covered.
    """

    def wrapping(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Wrapping | None:
        """A parsing deserializer and the refusal, for methods whose requests are parsed."""
        if handler.request_deserializer is None:
            return None
        return Wrapping(
            prepare=_refuse_unparsable,
            request_deserializer=_parsing(handler.request_deserializer, details.method),
        )
