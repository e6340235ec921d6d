"""A layer whose OTLP collector is down (a closed port): the failure is logged once, not per
export try, and a stop is not held up by the exports (a real loader process, real gRPC)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from e2e.stack import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.v1 import loader_pb2, loader_pb2_grpc

pytestmark = pytest.mark.e2e

TRACEPARENT = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
"""A caller's trace context: the loader makes a span only for calls within a trace."""
STOP_BOUND_S = 4.0
"""Longest a stop may take (about 1 s of flush plus the server's stop; ~7 s without a bound)."""


def wait_serving(address: str, deadline: float) -> None:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "the loader did not start"
            time.sleep(0.1)


def test_a_dead_collector_is_logged_once_and_does_not_hold_up_a_stop(
    dummy_model_dir: Path, tmp_path: Path
) -> None:
    model_dir = str(dummy_model_dir)
    collector = f"127.0.0.1:{free_port()}"  # nothing listens there
    address = f"unix:{tmp_path / 'loader.sock'}"
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export each span at once: many export tries
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",  # each export gives up after one retry (~1 s)
    }
    log_path = tmp_path / "loader.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zerolayer.loader", "--address", address, "--model", model_dir],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        wait_serving(address, time.monotonic() + 60)
        with grpc.insecure_channel(address) as channel:
            loader = loader_pb2_grpc.LoaderStub(channel)
            # Spans for ~4 s: each export's retry (1 s later; a warning) ends with an error at
            # ~1 s, when the next (2 s later) would pass its 3 s timeout: several failed exports.
            for _ in range(3):
                loader.GetManifest(loader_pb2.GetManifestRequest(), metadata=TRACEPARENT)
                time.sleep(1.2)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - stopped
    finally:
        proc.kill()
    text = log_path.read_text()
    assert took < STOP_BOUND_S, text
    failures = [line for line in text.splitlines() if collector in line]
    assert len(failures) == 1, text
    assert failures[0].endswith("(logged once until an export works again)")
