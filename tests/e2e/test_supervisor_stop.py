"""Stopping a stack after the supervisor restarted a layer: the restarted layer is stopped in
order with the final stop's SIGUSR1, like the others (not by the parent-death SIGHUP of the
supervisor thread)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from e2e.stack import running_stack

pytestmark = pytest.mark.e2e


def test_a_restarted_layer_is_stopped_for_good_in_order(
    dummy_model_dir: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    with running_stack(dummy_model_dir, logs) as stack:
        pid = stack.processes["kvstore"].pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while "kvstore is back" not in _back(stack) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stack.processes["kvstore"].pid != pid
    kvstore = (logs / "kvstore.log").read_text()
    assert "SIGHUP" not in kvstore
    assert kvstore.count("shutting down (SIGUSR1)") == 1
    # The stack's final stop: the kvstore releases the arena (it says so, rather than that it
    # keeps it for a restart that will not come).
    assert "releasing the arena" in kvstore.rsplit("shutting down", 1)[1]
    assert "keeping the arena" not in kvstore


def _back(stack) -> str:  # noqa: ANN001
    return "kvstore is back" if stack.num_restarts["kvstore"] == 1 and _healthy(stack) else ""


def _healthy(stack) -> bool:  # noqa: ANN001
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(stack.address("kvstore")) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        return status.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
