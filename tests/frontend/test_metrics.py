"""The request counter of the frontend: each call counted once, with the status code it ended with
(client cancellation, deadline, abort), read from the metrics' own registry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc._cython import cygrpc
from prometheus_client import CollectorRegistry

from zerolayer.common.errors import InvalidArgument
from zerolayer.frontend.metrics import (
    TIMEOUT_ROUNDING,
    FrontendMetrics,
    RequestCountingInterceptor,
)

METHOD = "/zerolayer.v1.TextGeneration/GenerateStream"


class FakeContext:
    """What the counter asks a servicer context: the deadline left and the status set; and where
    a wrapped response stream writes (``num_sendable`` messages, then the send fails as gRPC's
    does for a call that is over)."""

    def __init__(
        self,
        time_remaining: float | None,
        code: grpc.StatusCode | None = None,
        num_sendable: int | None = None,
        started_with: float | None = None,
    ) -> None:
        """
        Args:
            started_with: what the first time_remaining() answers (the handler's start);
                None: ``time_remaining`` throughout.
        """
        self._time_remaining = time_remaining
        self._started_with = started_with
        self._code = code
        self._num_sendable = num_sendable
        self.written: list[Any] = []

    async def write(self, message: Any) -> None:
        if self._num_sendable is not None and len(self.written) >= self._num_sendable:
            raise cygrpc.ExecuteBatchError("Failed 'execute_batch': (<grpc_call_error>, 1)")
        self.written.append(message)
        await asyncio.sleep(0)

    def time_remaining(self) -> float | None:
        if self._started_with is not None:
            started_with, self._started_with = self._started_with, None
            return started_with
        return self._time_remaining

    def code(self) -> grpc.StatusCode | None:
        return self._code


class Details:
    method = METHOD
    invocation_metadata = ()


def make_counted(handler: grpc.RpcMethodHandler) -> tuple[grpc.RpcMethodHandler, CollectorRegistry]:
    """``handler`` behind a RequestCountingInterceptor, and the registry it counts in."""
    registry = CollectorRegistry()
    interceptor = RequestCountingInterceptor(FrontendMetrics(registry), ("/zerolayer.",))

    async def continuation(details: Any) -> grpc.RpcMethodHandler:
        return handler

    return asyncio.run(interceptor.intercept_service(continuation, Details())), registry


def counts(registry: CollectorRegistry) -> dict[str, float]:
    """Non-zero counts of the GenerateStream method by code."""
    return {
        s.labels["code"]: s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "zerolayer_frontend_requests_total" and s.value
    }


async def endless_stream(request: Any, context: Any) -> AsyncIterator[str]:
    while True:
        yield "piece"
        await asyncio.sleep(0)


async def endless_call(request: Any, context: Any) -> str:
    await asyncio.sleep(3600)
    return "never"


@pytest.mark.parametrize(("time_remaining", "code"), [(None, "CANCELLED"), (5.0, "CANCELLED")])
def test_a_stream_whose_message_cannot_be_sent_is_cancelled(time_remaining, code) -> None:
    handler, registry = make_counted(grpc.unary_stream_rpc_method_handler(endless_stream))
    context = FakeContext(time_remaining, num_sendable=1)  # the client left after one message
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(handler.unary_stream(object(), context))
    assert context.written == ["piece"]
    assert counts(registry) == {code: 1}


@pytest.mark.parametrize("kind", ["unary", "stream"])
@pytest.mark.parametrize(
    ("time_remaining", "code"),
    [
        (None, "CANCELLED"),
        (2.5, "CANCELLED"),
        (0.0, "DEADLINE_EXCEEDED"),
        (-0.01, "DEADLINE_EXCEEDED"),
        # The client's deadline cancelled the call just before the server's deadline passed.
        (2.6e-05, "DEADLINE_EXCEEDED"),
        (0.03, "DEADLINE_EXCEEDED"),
        (0.5, "CANCELLED"),
    ],
)
def test_a_cancelled_handler_is_counted_by_what_cancelled_it(kind, time_remaining, code) -> None:
    if kind == "unary":
        handler, registry = make_counted(grpc.unary_unary_rpc_method_handler(endless_call))
        call = handler.unary_unary
    else:
        handler, registry = make_counted(grpc.unary_stream_rpc_method_handler(endless_stream))
        call = handler.unary_stream

    async def cancel_it() -> None:
        task = asyncio.create_task(call(object(), FakeContext(time_remaining)))
        await asyncio.sleep(0.01)
        task.cancel()  # what gRPC does when the client cancels or the deadline passes
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert counts(registry) == {code: 1}


@pytest.mark.parametrize(
    ("started_with", "time_remaining", "code"),
    [
        # A 30 s timeout's header is rounded up by up to 100 ms: with the transit time, the
        # client's own deadline can cancel the call with more than 0.1 s left at the server.
        (30.0, 0.15, "DEADLINE_EXCEEDED"),
        (30.0, 0.5, "CANCELLED"),
        # Above 100 s, the header is rounded up to whole seconds.
        (300.0, 2.0, "DEADLINE_EXCEEDED"),
        (300.0, 5.0, "CANCELLED"),
        (0.3, 0.05, "DEADLINE_EXCEEDED"),
        (0.3, 0.15, "CANCELLED"),
    ],
)
def test_the_slack_before_the_deadline_grows_with_the_timeout_the_call_started_with(
    started_with, time_remaining, code
) -> None:
    handler, registry = make_counted(grpc.unary_unary_rpc_method_handler(endless_call))

    async def cancel_it() -> None:
        context = FakeContext(time_remaining, started_with=started_with)
        task = asyncio.create_task(handler.unary_unary(object(), context))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert counts(registry) == {code: 1}


@pytest.mark.parametrize(("timeout_s", "header_s"), [(10.05, 10.1), (100.5, 101.0)])
def test_the_server_deadline_is_the_client_timeout_rounded_up_by_under_1_percent(
    timeout_s, header_s
) -> None:
    """What the slack above covers, measured with real gRPC: a Python client's grpc-timeout
    header is rounded up (to 3 significant digits), so the server's deadline is later than the
    client's by up to TIMEOUT_ROUNDING of the timeout."""

    async def remaining(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return repr(context.time_remaining()).encode()

    async def measure() -> float:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "t.T", {"Remaining": grpc.unary_unary_rpc_method_handler(remaining)}
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await channel.channel_ready()
                call = channel.unary_unary("/t.T/Remaining")
                return float(await call(b"", timeout=timeout_s))
        finally:
            await server.stop(None)

    server_remaining = asyncio.run(measure())
    assert timeout_s < server_remaining <= header_s
    assert server_remaining - timeout_s <= TIMEOUT_ROUNDING * timeout_s


def test_an_aborted_call_is_counted_with_the_code_it_aborted_with() -> None:
    async def aborting(request: Any, context: Any) -> None:
        raise grpc.aio.AbortError("Locally aborted.")

    handler, registry = make_counted(grpc.unary_unary_rpc_method_handler(aborting))
    context = FakeContext(None, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(handler.unary_unary(object(), context))
    assert counts(registry) == {"INVALID_ARGUMENT": 1}


async def two_pieces(request: Any, context: Any) -> AsyncIterator[str]:
    if not isinstance(request, str):  # a request stream
        request = "".join([r async for r in request])
    if request == "bad":
        raise InvalidArgument("text_input", "bad")
    yield request
    yield request


async def one_answer(request: Any, context: Any) -> str:
    return "".join([piece async for piece in two_pieces(request, context)])


async def requests(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


HANDLERS = {
    "unary_unary": grpc.unary_unary_rpc_method_handler(one_answer),
    "unary_stream": grpc.unary_stream_rpc_method_handler(two_pieces),
    "stream_unary": grpc.stream_unary_rpc_method_handler(one_answer),
    "stream_stream": grpc.stream_stream_rpc_method_handler(two_pieces),
}


@pytest.mark.parametrize("kind", list(HANDLERS))
@pytest.mark.parametrize(("text", "code"), [("ok", "OK"), ("bad", "INVALID_ARGUMENT")])
def test_every_kind_of_call_is_counted_once_with_its_final_code(kind, text, code) -> None:
    handler, registry = make_counted(HANDLERS[kind])
    request = requests(*text) if kind.startswith("stream") else text

    async def call() -> Any:
        context = FakeContext(None)
        answer = await getattr(handler, kind)(request, context)
        return answer if kind.endswith("unary") else context.written

    if code == "OK":
        assert asyncio.run(call()) == ("okok" if kind.endswith("unary") else ["ok", "ok"])
    else:
        with pytest.raises(InvalidArgument):
            asyncio.run(call())
    assert counts(registry) == {code: 1}


def in_flight(registry: CollectorRegistry) -> float | None:
    """The METHOD calls in flight."""
    return registry.get_sample_value(
        "zerolayer_frontend_requests_in_flight", {"method": METHOD.rsplit("/", 1)[-1]}
    )


@pytest.mark.parametrize("ending", ["OK", "INVALID_ARGUMENT", "CANCELLED"])
def test_a_call_is_in_flight_while_its_handler_runs(ending) -> None:
    release = asyncio.Event()

    async def waiting(request: Any, context: Any) -> AsyncIterator[str]:
        await release.wait()
        if ending == "INVALID_ARGUMENT":
            raise InvalidArgument("text_input", "bad")
        yield "piece"

    handler, registry = make_counted(grpc.unary_stream_rpc_method_handler(waiting))

    async def run() -> list[float | None]:
        seen = [in_flight(registry)]
        tasks = [
            asyncio.create_task(handler.unary_stream(object(), FakeContext(None))) for _ in range(3)
        ]
        await asyncio.sleep(0.01)
        seen.append(in_flight(registry))
        if ending == "CANCELLED":
            for task in tasks:
                task.cancel()
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        seen.append(in_flight(registry))
        return seen

    assert asyncio.run(run()) == [0, 3, 0]
    assert counts(registry) == {ending: 3}
