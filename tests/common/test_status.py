"""The one table from errors to gRPC statuses: each domain error class answers its code with its
message unchanged and the "answered by a handler" trailer, upstream gRPC errors are passed on or
made INTERNAL, and anything else is INTERNAL with one logged traceback; on a real server."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from grpc_records import without_stale_completions

from zerolayer.common import errors
from zerolayer.common.server import LayerServer
from zerolayer.common.status import (
    ANSWERED_METADATA,
    STATUS_CODES,
    answered_by_handler,
    reason_of,
    status_of,
)

Code = grpc.StatusCode
METHOD = "/test.Raiser/Raise"


def upstream(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a grpc.aio client call raises when the called layer answered ``code``."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class Overloaded(errors.ResourceExhausted):
    """A subclass answers with its nearest base class's code."""


DOMAIN_ERRORS = [
    (errors.InvalidArgument("prompt", "empty"), Code.INVALID_ARGUMENT, "prompt: empty"),
    (errors.NotFound("model: 'x' is not served"), Code.NOT_FOUND, "model: 'x' is not served"),
    (errors.ResourceExhausted("kv: 3 blocks"), Code.RESOURCE_EXHAUSTED, "kv: 3 blocks"),
    (errors.Unavailable("kvstore: down"), Code.UNAVAILABLE, "kvstore: down"),
    (errors.FailedPrecondition("arena: other"), Code.FAILED_PRECONDITION, "arena: other"),
    (errors.ZerolayerError("plain"), Code.INTERNAL, "plain"),
    (Overloaded("queue: full"), Code.RESOURCE_EXHAUSTED, "queue: full"),
]
OTHER_ERRORS = [
    (upstream(Code.UNAVAILABLE, "kv down"), Code.UNAVAILABLE, "upstream layer: kv down"),
    (upstream(Code.DEADLINE_EXCEEDED, "late"), Code.DEADLINE_EXCEEDED, "upstream layer: late"),
    (upstream(Code.INVALID_ARGUMENT, "id: dup"), Code.INVALID_ARGUMENT, "id: dup"),
    (upstream(Code.RESOURCE_EXHAUSTED, "big"), Code.RESOURCE_EXHAUSTED, "big"),
    (upstream(Code.NOT_FOUND, "gone"), Code.NOT_FOUND, "gone"),
    (upstream(Code.CANCELLED, "left"), Code.CANCELLED, "left"),
    (ValueError("boom"), Code.INTERNAL, "internal error: ValueError: boom"),
]


def test_every_domain_error_class_has_its_code_in_the_table() -> None:
    classes = {
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.ZerolayerError)
    }
    assert dict(STATUS_CODES) == {
        errors.ZerolayerError: Code.INTERNAL,
        errors.InvalidArgument: Code.INVALID_ARGUMENT,
        errors.NotFound: Code.NOT_FOUND,
        errors.ResourceExhausted: Code.RESOURCE_EXHAUSTED,
        errors.Unavailable: Code.UNAVAILABLE,
        errors.SchedulerLost: Code.UNAVAILABLE,
        errors.FailedPrecondition: Code.FAILED_PRECONDITION,
        errors.Unauthenticated: Code.UNAUTHENTICATED,
    }
    assert set(STATUS_CODES) == classes


@pytest.mark.parametrize(("exc", "code", "details"), DOMAIN_ERRORS)
def test_domain_errors_answer_their_code_and_message_as_answered(exc, code, details) -> None:
    status = status_of(exc)
    assert (status.code, status.details, status.unexpected) == (code, details, False)
    assert status.trailing_metadata == (ANSWERED_METADATA,)


def test_upstream_codes_outside_the_pass_through_list_are_unexpected() -> None:
    status = status_of(upstream(Code.FAILED_PRECONDITION, "unreconciled"))
    assert (status.code, status.unexpected, status.trailing_metadata) == (Code.INTERNAL, True, ())
    assert status.details.startswith("internal error: AioRpcError: ")


def raising(exc: Exception) -> grpc.GenericRpcHandler:
    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise exc

    return grpc.method_handlers_generic_handler(
        "test.Raiser", {"Raise": grpc.unary_unary_rpc_method_handler(handler)}
    )


async def answer_of(socket: Path, exc: Exception) -> grpc.aio.AioRpcError:
    """What a client sees when the handler of a method of a non-zerolayer service raises."""
    server = LayerServer(f"unix:{socket}", [])
    server.server.add_generic_rpc_handlers((raising(exc),))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary(METHOD)(b"", timeout=10)
    finally:
        await server.stop(0)
    return info.value


@pytest.mark.parametrize(("exc", "code", "details"), DOMAIN_ERRORS + OTHER_ERRORS)
def test_a_served_method_answers_what_the_table_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, exc, code, details
) -> None:
    with caplog.at_level(logging.INFO):
        answer = asyncio.run(answer_of(tmp_path / "s.sock", exc))
    assert (answer.code(), answer.details()) == (code, details)
    domain = isinstance(exc, errors.ZerolayerError)
    assert answered_by_handler(answer) is domain
    tracebacks = [r for r in without_stale_completions(caplog.records) if r.exc_info]
    if isinstance(exc, ValueError):
        (record,) = tracebacks
        assert (record.getMessage(), record.exc_info[1]) == ("unexpected error in handler", exc)
    else:
        assert tracebacks == []


class LeaseGone(errors.FailedPrecondition):
    """A domain error with a machine-readable reason."""

    reason = "owner-lease-expired"


def test_a_reason_travels_as_trailing_metadata(tmp_path: Path) -> None:
    status = status_of(LeaseGone("owner 'a' epoch 1: lease expired"))
    assert status.trailing_metadata == (
        ANSWERED_METADATA,
        ("zerolayer-reason", "owner-lease-expired"),
    )
    answer = asyncio.run(answer_of(tmp_path / "s.sock", LeaseGone("owner 'a': lease expired")))
    assert (answer.code(), reason_of(answer)) == (Code.FAILED_PRECONDITION, "owner-lease-expired")
    plain = asyncio.run(answer_of(tmp_path / "t.sock", errors.FailedPrecondition("arena: other")))
    assert reason_of(plain) == ""


def failing_after_the_deadline(kind: str, left: asyncio.Event) -> grpc.RpcMethodHandler:
    """A ``kind`` handler that fails once its call is past the client's deadline (as the
    frontend's wait for a scheduler, or its upstream call, does when the client's deadline
    passes), with a protobuf serializer, which cannot serialize None."""

    def wait_out(context: grpc.aio.ServicerContext) -> None:
        # NOTE: blocks the loop (no await), so gRPC cannot cancel this task before it raises.
        while context.time_remaining() > 0:
            time.sleep(0.01)
        left.set()

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> Empty:
        wait_out(context)
        raise errors.Unavailable("scheduler: none can take requests")

    async def stream(request: bytes, context: grpc.aio.ServicerContext):  # noqa: ANN202
        wait_out(context)
        raise upstream(Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
        yield Empty()  # a server-streaming handler that had sent nothing yet

    if kind == "unary_unary":
        return grpc.unary_unary_rpc_method_handler(
            unary, response_serializer=Empty.SerializeToString
        )
    return grpc.unary_stream_rpc_method_handler(stream, response_serializer=Empty.SerializeToString)


async def raise_after_the_deadline(socket: Path, kind: str) -> None:
    left = asyncio.Event()
    server = LayerServer(f"unix:{socket}", [])
    server.server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Raiser", {"Raise": failing_after_the_deadline(kind, left)}
            ),
        )
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                if kind == "unary_unary":
                    await channel.unary_unary(METHOD)(b"", timeout=0.3)
                else:
                    async for _ in channel.unary_stream(METHOD)(b"", timeout=0.3):
                        pass
            assert info.value.code() == Code.DEADLINE_EXCEEDED
            await asyncio.wait_for(left.wait(), 5)
            await asyncio.sleep(0.2)  # where gRPC would log its failed attempt to answer
    finally:
        await server.stop(0)


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream"])
def test_an_error_after_the_call_is_over_is_not_answered_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    with caplog.at_level(logging.DEBUG):
        asyncio.run(raise_after_the_deadline(tmp_path / "s.sock", kind))
    errors_logged = [
        r for r in without_stale_completions(caplog.records) if r.levelno >= logging.ERROR
    ]
    assert errors_logged == []
    assert any(r.getMessage().startswith("call over (cancelled or past") for r in caplog.records)
