"""``zerolayer health`` against a real gRPC health server on a unix socket: the exit code a probe
reads and the one line it leaves in the pod's events."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from zerolayer.cli.main import main as zerolayer_main

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, health.HealthServicer]]:
    """A gRPC server with the standard health service on ``unix:<tmp>/layer.sock``."""
    address = f"unix:{tmp_path}/layer.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(address)
    server.start()
    yield address, servicer
    server.stop(0)


def test_serving_exits_0_silently(served, capsys) -> None:
    address, servicer = served
    servicer.set("", SERVING)
    assert zerolayer_main(["health", "--address", address]) == 0
    assert capsys.readouterr() == ("", "")


def test_not_serving_exits_1_with_one_line(served, capsys) -> None:
    address, servicer = served
    servicer.set("", NOT_SERVING)
    assert zerolayer_main(["health", "--address", address]) == 1
    assert capsys.readouterr().err == f"zerolayer health: {address}: NOT_SERVING\n"


def test_alive_accepts_any_answer_but_not_silence(served, tmp_path: Path, capsys) -> None:
    address, servicer = served
    servicer.set("", NOT_SERVING)
    assert zerolayer_main(["health", "--address", address, "--alive"]) == 0
    nowhere = f"unix:{tmp_path}/nobody.sock"
    assert zerolayer_main(["health", "--address", nowhere, "--alive", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"zerolayer health: {nowhere}: UNAVAILABLE: "), err
    assert err.count("\n") == 1


def test_a_named_service_is_checked_and_an_unknown_one_fails(served, capsys) -> None:
    address, servicer = served
    servicer.set("", SERVING)
    servicer.set("zerolayer.v1.Scheduler", NOT_SERVING)
    argv = ["health", "--address", address, "--service"]
    assert zerolayer_main([*argv, "zerolayer.v1.Scheduler"]) == 1
    assert capsys.readouterr().err == f"zerolayer health: {address}: NOT_SERVING\n"
    assert zerolayer_main([*argv, "zerolayer.v1.Nothing"]) == 1
    assert capsys.readouterr().err.startswith(
        f"zerolayer health: {address}: NOT_FOUND: no such service"
    )


def test_the_address_is_required(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        zerolayer_main(["health"])
    assert exit_info.value.code == 2
    assert "--address" in capsys.readouterr().err
