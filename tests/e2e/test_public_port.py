"""What the public port shows and how it treats a client that goes away, tried as a user does on
the shared stack: gRPC reflection through grpcio-reflection's client, and an HTTP request whose
body ends early through a raw socket."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

pytestmark = pytest.mark.e2e

PUBLIC_SERVICES = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
    "zerolayer.v1.TextGeneration",
]
PUBLIC_FILES = {
    "grpc_health/v1/health.proto",
    "grpc_reflection/v1alpha/reflection.proto",
    "zerolayer/kserve/v2/grpc_service.proto",
    "zerolayer/v1/generation.proto",
}


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture
def reflection(stack):
    with grpc.insecure_channel(stack.config.listen) as channel:
        yield ProtoReflectionDescriptorDatabase(channel)


def test_reflection_lists_only_the_public_services(reflection) -> None:
    assert sorted(reflection.get_services()) == PUBLIC_SERVICES


def test_reflection_describes_the_public_services_and_their_files(reflection) -> None:
    files = {reflection.FindFileContainingSymbol(s).name for s in PUBLIC_SERVICES}
    assert files == PUBLIC_FILES
    generation = reflection.FindFileContainingSymbol("zerolayer.v1.GenerateRequest")
    assert generation.name == "zerolayer/v1/generation.proto"


@pytest.mark.parametrize(
    "symbol",
    [
        "zerolayer.v1.Scheduler",
        "zerolayer.v1.KVStore",
        "zerolayer.v1.Loader",
        "zerolayer.v1.SchedulerStats",
        "zerolayer.v1.AllocateRequest",
    ],
)
def test_reflection_knows_no_internal_symbol(reflection, symbol: str) -> None:
    with pytest.raises(KeyError):
        reflection.FindFileContainingSymbol(symbol)


@pytest.mark.parametrize(
    "name",
    ["zerolayer/v1/scheduler.proto", "zerolayer/v1/kvstore.proto", "zerolayer/v1/loader.proto"],
)
def test_reflection_serves_no_internal_file(reflection, name: str) -> None:
    with pytest.raises(KeyError):
        reflection.FindFileByName(name)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages", "/v1/responses"])
def test_a_body_cut_short_by_its_client_is_one_info_line_not_a_traceback(stack, path) -> None:
    log = Path(stack.config.log_dir) / "frontend.log"
    start = log.stat().st_size
    host, _, port = stack.config.http_listen.rpartition(":")
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) + 1000}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(head.encode() + body[: len(body) // 2])
    # NOTE: the frontend logs the disconnect once it reads the closed socket; a request after it
    # on a new connection is answered after that read, so its answer orders the two.
    marker = "client disconnected before the body ended"
    deadline = time.monotonic() + 10
    while marker not in (text := log.read_text()[start:]) and time.monotonic() < deadline:
        with socket.create_connection((host, int(port)), timeout=10) as probe:
            probe.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert probe.recv(100).startswith(b"HTTP/1.1 200")
    lines = [line for line in text.splitlines() if line.strip()]
    assert [line for line in lines if marker in line] == [
        next(line for line in lines if marker in line)
    ]
    assert " INFO " in next(line for line in lines if marker in line)
    assert not [line for line in lines if " ERROR " in line or "Traceback" in line]
