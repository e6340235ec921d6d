"""The layer server bootstrap: request bytes that are not the method's protobuf message are refused
with INVALID_ARGUMENT (no traceback), for every kind of method, and valid calls still work."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_records import without_stale_completions
from grpc_reflection.v1alpha import reflection_pb2

from zerolayer.common.server import BindError, LayerServer, ServiceBinding
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

SERVICE = "/zerolayer.v1.TextGeneration/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
MALFORMED = [
    (b"\xff\xff\xff\xff", "Wire format was corrupt"),
    (bytes.fromhex("0a0341fffe"), "String field had bad UTF-8"),  # text = b"A\xff\xfe"
    (b"\x0a\x05ab", "Wire format was corrupt"),  # a 5-byte string cut after 2 bytes
]


class Servicer(generation_pb2_grpc.TextGenerationServicer):
    """Answers Tokenize with one id per character and streams one message per character."""

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        return pb.TokenizeResponse(token_ids=[ord(c) for c in request.text])

    async def GenerateStream(
        self, request: pb.GenerateRequest, context
    ) -> AsyncIterator[pb.GenerateResponse]:
        for c in request.prompt:
            yield pb.GenerateResponse(text=c)


async def serve_and_call(socket: Path, calls) -> None:  # noqa: ANN001
    name = pb.DESCRIPTOR.services_by_name["TextGeneration"].full_name
    binding = ServiceBinding(
        generation_pb2_grpc.add_TextGenerationServicer_to_server, Servicer(), name
    )
    server = LayerServer(f"unix:{socket}", [binding])
    await server.start()
    await server.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            await calls(channel)
    finally:
        await server.stop(0)


async def call_raw(channel: grpc.aio.Channel, kind: str, method: str, raw: bytes) -> None:
    """Sends ``raw`` as the request (or the request stream's one message) of ``method``."""
    if kind == "unary":
        await channel.unary_unary(method)(raw, timeout=10)
    elif kind == "server stream":
        async for _ in channel.unary_stream(method)(raw, timeout=10):
            pass
    else:
        async for _ in channel.stream_stream(method)(iter([raw]), timeout=10):
            pass


@pytest.mark.parametrize(("raw", "reason"), MALFORMED)
def test_unparsable_requests_are_invalid_argument_for_every_kind_of_method(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, raw: bytes, reason: str
) -> None:
    methods = [
        ("unary", SERVICE + "Tokenize", "zerolayer.v1.TokenizeRequest"),
        ("server stream", SERVICE + "GenerateStream", "zerolayer.v1.GenerateRequest"),
        ("bidi stream", REFLECTION, "grpc.reflection.v1alpha.ServerReflectionRequest"),
    ]
    answers = []

    async def calls(channel: grpc.aio.Channel) -> None:
        for kind, method, _ in methods:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call_raw(channel, kind, method, raw)
            answers.append((info.value.code(), info.value.details()))

    with caplog.at_level(logging.INFO):
        asyncio.run(serve_and_call(tmp_path / "s.sock", calls))
    assert answers == [
        (grpc.StatusCode.INVALID_ARGUMENT, f"request: could not be parsed as {name}: {reason}")
        for _, _, name in methods
    ]
    records = without_stale_completions(caplog.records)  # an earlier test's late completion
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{method}: {len(raw)} request bytes are not a {name} ({reason})"
        for _, method, name in methods
    ]


def test_valid_calls_of_every_kind_still_work(tmp_path: Path) -> None:
    async def calls(channel: grpc.aio.Channel) -> None:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        tokens = await stub.Tokenize(pb.TokenizeRequest(text="ab"), timeout=10)
        assert list(tokens.token_ids) == [97, 98]
        parts = [r.text async for r in stub.GenerateStream(pb.GenerateRequest(prompt="xyz"))]
        assert parts == ["x", "y", "z"]
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="zerolayer.v1.TextGeneration")
        assert (await health.Check(request)).status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(request)  # a streaming handler written with context.write
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflection = channel.stream_stream(
            REFLECTION,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = [a async for a in reflection(iter([listing]), timeout=10)]
        names = {s.name for s in answers[0].list_services_response.service}
        assert "zerolayer.v1.TextGeneration" in names

    asyncio.run(serve_and_call(tmp_path / "s.sock", calls))


def test_a_unix_socket_that_cannot_be_bound_is_refused_like_a_taken_port(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'missing' / 's.sock'}"  # its directory does not exist

    async def start() -> None:
        await LayerServer(address, []).start()

    with pytest.raises(RuntimeError, match=f"^cannot listen on {address} \\(no socket file"):
        asyncio.run(start())


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_something_but_a_socket_at_a_unix_address_is_refused_and_kept(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "s.sock"
    if kind == "file":
        path.write_text("precious")
    else:
        path.symlink_to(tmp_path / "elsewhere")

    async def start() -> None:
        await LayerServer(f"unix:{path}", []).start()

    with pytest.raises(
        BindError, match=f"^cannot listen on unix:{path} \\({path} is there and is not a socket"
    ):
        asyncio.run(start())
    assert os.path.lexists(path)


def test_a_stale_socket_of_this_user_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))

    async def start_and_stop() -> None:
        server = LayerServer(f"unix:{path}", [])
        await server.start()
        await server.stop()

    asyncio.run(start_and_stop())
