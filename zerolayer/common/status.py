"""The one place where errors become gRPC statuses, for every service a layer serves.

Domain code raises :mod:`zerolayer.common.errors`; :data:`STATUS_CODES` says which status code
each class answers with, and :class:`ErrorMappingInterceptor` answers it for every method of
every service (zerolayer's own, KServe's ``inference.GRPCInferenceService``, any other), with
the exception's message as the details. A gRPC error from an upstream layer that a handler lets
through is passed on as described in :func:`status_of`; anything else is an INTERNAL error,
logged once with its traceback. Status code meanings:
https://grpc.github.io/grpc/core/md_doc_statuscodes.html
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import grpc

from zerolayer.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SchedulerLost,
    Unauthenticated,
    Unavailable,
    ZerolayerError,
)
from zerolayer.common.interceptors import Wrapping, WrappingInterceptor

log = logging.getLogger(__name__)

STATUS_CODES = MappingProxyType(
    {
        ZerolayerError: grpc.StatusCode.INTERNAL,
        InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
        NotFound: grpc.StatusCode.NOT_FOUND,
        ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
        Unavailable: grpc.StatusCode.UNAVAILABLE,
        SchedulerLost: grpc.StatusCode.UNAVAILABLE,
        FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
        Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    }
)
"""The status code of each domain error class (a subclass answers with its nearest base's)."""

UPSTREAM_NAMED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Upstream codes passed on with details prefixed by "upstream layer: " (which layer failed)."""
UPSTREAM_PASSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.CANCELLED,
    }
)
"""Upstream codes passed on with their details unchanged (they are about the request)."""

REASON_METADATA_KEY = "zerolayer-reason"
"""Trailing metadata key of a domain error's :attr:`ZerolayerError.reason`."""

ANSWERED_METADATA = ("zerolayer-answered-by-handler", "1")
"""Trailing metadata of a status a handler chose (a domain error), so that a caller can tell
"the layer answered UNAVAILABLE" (e.g. the scheduler: its kvstore is down) from "the layer could
not be reached" (worth retrying while it restarts)."""


@dataclass(frozen=True)
class Status:
    """The status a call ends with."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str], ...] = ()
    unexpected: bool = False
    """True for an error nothing above covers: a bug, answered INTERNAL and worth a traceback."""


def status_code_of(error: ZerolayerError) -> grpc.StatusCode:
    """The status code ``error`` answers with: that of its class in :data:`STATUS_CODES`, or
    of its nearest base class there."""
    return next(STATUS_CODES[c] for c in type(error).__mro__ if c in STATUS_CODES)


def status_of(exc: Exception) -> Status:
    """The status a handler that raised ``exc`` answers with (logs nothing).

    - a :class:`ZerolayerError`: its table code, its message, :data:`ANSWERED_METADATA` (and its
      ``reason`` under :data:`REASON_METADATA_KEY` when it has one);
    - an upstream ``grpc.aio.AioRpcError``: UNAVAILABLE and DEADLINE_EXCEEDED as
      "upstream layer: <details>", INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND and
      CANCELLED with their details; any other code is unexpected;
    - anything else: unexpected, INTERNAL "internal error: <type>: <message>".
    """
    if isinstance(exc, ZerolayerError):
        reason = ((REASON_METADATA_KEY, exc.reason),) if exc.reason else ()
        return Status(status_code_of(exc), str(exc), (ANSWERED_METADATA, *reason))
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in UPSTREAM_NAMED:
            return Status(code, f"upstream layer: {exc.details()}")
        if code in UPSTREAM_PASSED:
            return Status(code, exc.details() or "")
    return Status(
        grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}", unexpected=True
    )


def answer_status(exc: Exception) -> Status:
    """:func:`status_of`, logging an unexpected error once with its traceback."""
    status = status_of(exc)
    if status.unexpected:
        log.error("unexpected error in handler", exc_info=exc)
    return status


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    """Ends the call with the status of ``exc`` (see :func:`status_of`).

    Raises:
        grpc.aio.AbortError: always (how grpc.aio ends a call from inside a handler).
    """
    status = answer_status(exc)
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)


def reason_of(exc: grpc.RpcError) -> str:
    """The ``reason`` of the domain error behind the status of ``exc`` (see
    :attr:`ZerolayerError.reason`); empty when it has none."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return next((value for key, value in trailing or () if key == REASON_METADATA_KEY), "")


def answered_by_handler(exc: grpc.RpcError) -> bool:
    """True when the status of ``exc`` came from a zerolayer handler (see ANSWERED_METADATA)."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return ANSWERED_METADATA in tuple(trailing or ())


@asynccontextmanager
async def _answering_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    try:
        yield
    except grpc.aio.AbortError:
        raise  # the status is already sent (e.g. a request that did not parse)
    except Exception as exc:  # noqa: BLE001 - the edge answers everything
        if call_is_over(context):
            # NOTE: the client cancelled or the deadline passed: gRPC has ended the call with
            # that status already, and sending another one fails inside gRPC (a logged
            # ExecuteBatchError traceback). What the handler raised is the consequence. The call
            # ends as one gRPC cancels itself: nothing more is sent, and a unary handler does not
            # return None for gRPC to serialize (a logged TypeError traceback).
            log.debug("call over (cancelled or past its deadline): %s", exc)
            raise asyncio.CancelledError from exc
        await abort_with(context, exc)


def call_is_over(context: grpc.aio.ServicerContext) -> bool:
    """True once the client cancelled the call or its deadline passed: no status can be sent."""
    remaining = context.time_remaining()
    return context.cancelled() or (remaining is not None and remaining <= 0)


class ErrorMappingInterceptor(WrappingInterceptor):
    """Answers what any handler raises with its status (:func:`status_of`), for every method of
    every service. Health and reflection raise nothing of ours, so they answer as before."""

    def wrapping(self, handler: Any, details: grpc.HandlerCallDetails) -> Wrapping:
        """The same for every method: errors become statuses."""
        return Wrapping(around=_answering_errors)
