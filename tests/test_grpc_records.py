"""tests/grpc_records.py: the record gRPC's poller makes for a completion of a closed event loop
is recognized (made here for real, as an earlier test makes it), and nothing else is."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_records import CALLBACK, stale_completion, without_stale_completions

METHOD = "/test.Slow/Answer"


def slow_server(started: threading.Event, release: threading.Event) -> tuple[grpc.Server, str]:
    """A threaded server whose one method answers once ``release`` is set (``started`` is set
    when the call arrived); and its address."""

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        started.set()
        release.wait(30)
        return b"done"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    handler = grpc.unary_unary_rpc_method_handler(answer)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Slow", {"Answer": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_completion_of_a_closed_loop_is_the_record_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call in flight when its loop closes (``asyncio.run`` cancels it first, but under load
    the cancellation may complete only after the close; here the loop closes without cancelling
    it, so the completion surely comes late) completes while another loop runs."""
    started, release = threading.Event(), threading.Event()
    server, address = slow_server(started, release)
    in_flight = []

    async def start_a_call() -> None:
        channel = grpc.aio.insecure_channel(address)
        in_flight.append((channel, channel.unary_unary(METHOD)(b"", timeout=30)))
        assert await asyncio.to_thread(started.wait, 10)

    async def let_it_complete_under_another_loop() -> None:
        async with grpc.aio.insecure_channel(address):  # this loop polls the completion queue
            release.set()
            deadline = time.monotonic() + 10
            while not any(r.name == "asyncio" for r in caplog.records):
                assert time.monotonic() < deadline, "no record of the late completion"
                await asyncio.sleep(0.01)  # the loop must run to take the completion

    closed = asyncio.new_event_loop()
    closed.set_exception_handler(lambda loop, context: None)  # its call, pending for good
    try:
        with caplog.at_level(logging.ERROR):
            try:
                closed.run_until_complete(start_a_call())
            finally:
                closed.close()
            asyncio.run(let_it_complete_under_another_loop())
    finally:
        release.set()
        server.stop(0)
    (record,) = caplog.records
    assert record.getMessage().startswith(CALLBACK) and record.levelno == logging.ERROR
    assert stale_completion(record)
    assert without_stale_completions(caplog.records) == []


def record(name: str, message: str, exc: BaseException | None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, exc_info)


STALE = f"{CALLBACK}(<_UnixSelectorEventLoop running=True closed=False debug=False>)()"


@pytest.mark.parametrize(
    ("name", "message", "exc", "left_out"),
    [
        ("asyncio", STALE, RuntimeError("Event loop is closed"), True),
        ("asyncio", STALE, RuntimeError("Event loop is closed, and more"), False),
        ("asyncio", STALE, ValueError("Event loop is closed"), False),
        ("asyncio", STALE, None, False),
        (
            "asyncio",
            "Exception in callback Server._serve()",
            RuntimeError("Event loop is closed"),
            False,
        ),
        ("grpc._cython.cygrpc", STALE, RuntimeError("Event loop is closed"), False),
        ("zerolayer.common.server", "unexpected error in handler", KeyError("oops"), False),
    ],
)
def test_only_that_record_is_left_out(
    name: str, message: str, exc: BaseException | None, left_out: bool
) -> None:
    given = record(name, message, exc)
    assert stale_completion(given) is left_out
    assert without_stale_completions([given]) == ([] if left_out else [given])
