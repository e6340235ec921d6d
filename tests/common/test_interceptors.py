"""The one helper that wraps handlers: every kind of method (unary-unary, unary-stream,
stream-unary, stream-stream, and the reader-writer form) gets the interceptor's context around the
whole call and its check of each request message, on a real grpc.aio server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from zerolayer.common.interceptors import Wrapping, WrappingInterceptor, wrap_handler

SERVICE = "test.Echo"


async def one_answer(request: Any, context: grpc.aio.ServicerContext) -> bytes:
    if not isinstance(request, bytes):  # a request stream
        request = b"".join([r async for r in request])
    if request.startswith(b"FAIL"):  # "fail", upper-cased by the interceptor
        raise ValueError(request.decode())
    return request


async def two_answers(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    answer = await one_answer(request, context)
    yield answer
    yield answer


async def written(request: bytes, context: grpc.aio.ServicerContext) -> None:
    """A response stream in the reader-writer form (health's Watch is one)."""
    await context.write(request)


def sync_answer(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


HANDLERS = {
    name: make_handler(function)
    for name, make_handler, function in [
        ("UnaryUnary", grpc.unary_unary_rpc_method_handler, one_answer),
        ("UnaryStream", grpc.unary_stream_rpc_method_handler, two_answers),
        ("StreamUnary", grpc.stream_unary_rpc_method_handler, one_answer),
        ("StreamStream", grpc.stream_stream_rpc_method_handler, two_answers),
        ("Written", grpc.unary_stream_rpc_method_handler, written),
        ("Sync", grpc.unary_unary_rpc_method_handler, sync_answer),
    ]
}
"""One method of each kind, the reader-writer form, and a synchronous handler."""


class Recording(WrappingInterceptor):
    """Records when each call enters and leaves its context (and with what), and upper-cases
    every request message."""

    def __init__(self, prefixes: tuple[str, ...] = ("/",)) -> None:
        super().__init__(prefixes)
        self.events: list[tuple[str, str]] = []

    def wrapping(self, handler: grpc.RpcMethodHandler, details: Any) -> Wrapping:
        method = details.method.rsplit("/", 1)[-1]

        @asynccontextmanager
        async def around(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            self.events.append((method, "enter"))
            try:
                yield
            except BaseException as exc:
                self.events.append((method, type(exc).__name__))
                raise
            self.events.append((method, "ok"))

        async def prepare(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.events.append((method, f"request {request.decode()}"))
            return request.upper()

        return Wrapping(around=around, prepare=prepare)


async def call(channel: grpc.aio.Channel, method: str, *messages: bytes) -> list[bytes]:
    """The answers to ``messages`` (one request, or a request stream of them)."""
    path = f"/{SERVICE}/{method}"
    if method.startswith("Stream"):
        requests = iter(messages)
        if method == "StreamUnary":
            return [await channel.stream_unary(path)(requests, timeout=10)]
        return [a async for a in channel.stream_stream(path)(requests, timeout=10)]
    if method in ("UnaryStream", "Written"):
        return [a async for a in channel.unary_stream(path)(messages[0], timeout=10)]
    return [await channel.unary_unary(path)(messages[0], timeout=10)]


async def serve(socket: Path, interceptor: Recording, calls, handlers=HANDLERS) -> None:  # noqa: ANN001
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            await calls(channel)
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("method", "messages", "answers", "requests"),
    [
        ("UnaryUnary", [b"ab"], [b"AB"], ["ab"]),
        ("UnaryStream", [b"ab"], [b"AB", b"AB"], ["ab"]),
        ("StreamUnary", [b"a", b"b"], [b"AB"], ["a", "b"]),
        ("StreamStream", [b"a", b"b"], [b"AB", b"AB"], ["a", "b"]),
        ("Written", [b"ab"], [b"AB"], ["ab"]),
    ],
)
def test_every_kind_of_method_is_wrapped_around_the_whole_call(
    tmp_path: Path, method, messages, answers, requests
) -> None:
    interceptor = Recording()
    got: list[bytes] = []

    async def calls(channel: grpc.aio.Channel) -> None:
        got.extend(await call(channel, method, *messages))

    asyncio.run(serve(tmp_path / "s.sock", interceptor, calls))
    assert got == answers
    assert interceptor.events == [
        (method, "enter"),
        *((method, f"request {r}") for r in requests),
        (method, "ok"),
    ]


@pytest.mark.parametrize("method", ["UnaryUnary", "UnaryStream", "StreamUnary", "StreamStream"])
def test_the_context_sees_what_the_handler_raised(tmp_path: Path, method: str) -> None:
    interceptor = Recording()

    async def calls(channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(channel, method, b"fail")
        assert info.value.code() == grpc.StatusCode.UNKNOWN  # nothing maps errors here

    asyncio.run(serve(tmp_path / "s.sock", interceptor, calls))
    assert interceptor.events == [
        (method, "enter"),
        (method, "request fail"),
        (method, "ValueError"),
    ]


def test_synchronous_handlers_and_methods_outside_the_prefixes_are_left_alone(
    tmp_path: Path,
) -> None:
    for name, interceptor, expected in [
        ("a", Recording(), b"AB"),
        ("b", Recording(prefixes=("/other.",)), b"ab"),
    ]:

        async def calls(channel: grpc.aio.Channel, expected: bytes = expected) -> None:
            assert await call(channel, "Sync", b"ab") == [b"ab"]
            assert await call(channel, "UnaryUnary", b"ab") == [expected]

        asyncio.run(serve(tmp_path / f"{name}.sock", interceptor, calls))
        wrapped = [("UnaryUnary", "enter"), ("UnaryUnary", "request ab"), ("UnaryUnary", "ok")]
        assert interceptor.events == (wrapped if expected == b"AB" else [])


def test_a_stream_the_client_leaves_is_closed_before_the_call_ends(tmp_path: Path) -> None:
    closed = asyncio.Event()

    async def endless(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            while True:
                yield request
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    handler = grpc.unary_stream_rpc_method_handler(endless)
    wrapped = wrap_handler(handler, Wrapping())
    assert (wrapped.request_streaming, wrapped.response_streaming) == (False, True)
    interceptor = Recording()

    async def calls(channel: grpc.aio.Channel) -> None:
        stream = channel.unary_stream(f"/{SERVICE}/Endless")(b"x", timeout=10)
        assert await stream.read() == b"X"
        stream.cancel()
        await asyncio.wait_for(closed.wait(), 5)

    asyncio.run(serve(tmp_path / "s.sock", interceptor, calls, {"Endless": wrapped}))
    assert interceptor.events[:2] == [("Endless", "enter"), ("Endless", "request x")]
