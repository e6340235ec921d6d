"""Without supervision (``zerolayer up --no-supervise``):

- a killed scheduler is not restarted: the public health and KServe readiness say so at once, and
  once it is started again they say SERVING only when a Generate is served (not while its engine
  still warms up);
- a killed kvstore is logged and not restarted, and requests that need it end with UNAVAILABLE
  after the scheduler's ``--kv-unavailable-timeout-s`` instead of hanging; from then on the
  scheduler, and so the public health, report NOT_SERVING; the scheduler keeps answering.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from e2e.stack import running_stack, scheduler_stats, text_stub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.kserve.v2 import grpc_service_pb2 as kserve_pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as kserve_grpc
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

TIMEOUT_S = 2.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
PUBLIC_NAMES = ("", "zerolayer.v1.TextGeneration", "inference.GRPCInferenceService")
"""The frontend's health names a load balancer or a Kubernetes probe reads."""


def readiness(stack: Stack) -> dict[str, object]:
    """Every public health name's status, and KServe's ServerReady and ModelReady."""
    model = Path(stack.config.model_dir).name
    with grpc.insecure_channel(stack.config.listen) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        said: dict[str, object] = {
            name: health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            for name in PUBLIC_NAMES
        }
        said["ServerReady"] = kserve.ServerReady(kserve_pb.ServerReadyRequest(), timeout=5).ready
        said["ModelReady"] = kserve.ModelReady(
            kserve_pb.ModelReadyRequest(name=model), timeout=5
        ).ready
    return said


def ready(serving: bool) -> dict[str, object]:
    status = SERVING if serving else NOT_SERVING
    return {**dict.fromkeys(PUBLIC_NAMES, status), "ServerReady": serving, "ModelReady": serving}


def wait_readiness(stack: Stack, serving: bool, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (said := readiness(stack)) != ready(serving):
        assert time.monotonic() < deadline, said
        time.sleep(0.05)


def test_readiness_follows_an_unsupervised_scheduler(dummy_model_dir: Path, tmp_path: Path) -> None:
    with running_stack(dummy_model_dir, tmp_path / "logs", supervise=False) as stack:
        stub = text_stub(stack)
        request = pb.GenerateRequest(prompt="hello", max_new_tokens=4)
        assert readiness(stack) == ready(True)
        scheduler = stack.processes["scheduler"]
        os.kill(scheduler.pid, signal.SIGKILL)
        scheduler.wait(timeout=10)
        wait_readiness(stack, False, 5)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        # Started again: the scheduler listens, and answers its own health, seconds before its
        # engine has warmed up; the public health must wait for the engine. A Generate sent the
        # moment it says SERVING is served.
        with grpc.insecure_channel(stack.config.listen) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=120
            )
            statuses = [next(watch).status]
            stack.start_layer("scheduler")
            while statuses[-1] != SERVING:
                statuses.append(next(watch).status)
            response = stub.Generate(request, timeout=30)
            watch.cancel()
        assert statuses[0] == NOT_SERVING
        assert len(response.token_ids) == 4
        assert readiness(stack) == ready(True)


def test_requests_end_with_unavailable_once_the_unsupervised_kvstore_is_gone(
    dummy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zerolayer.stack.launcher")
    with running_stack(
        dummy_model_dir, tmp_path / "logs", supervise=False, kv_unavailable_timeout_s=TIMEOUT_S
    ) as stack:
        stub = text_stub(stack)
        request = pb.GenerateRequest(prompt="hello", max_new_tokens=4)
        assert len(stub.Generate(request, timeout=30).token_ids) == 4
        kvstore = stack.processes["kvstore"]
        os.kill(kvstore.pid, signal.SIGKILL)
        kvstore.wait(timeout=10)

        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as first:
            stub.Generate(request, timeout=60)
        first_s = time.monotonic() - start
        assert first.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "kvstore: unusable for more than 2 s" in first.value.details()
        assert TIMEOUT_S <= first_s < TIMEOUT_S + 15

        # The outage is older than the timeout now: the scheduler reports NOT_SERVING (its
        # process is fine: its "" stays SERVING), so does the public health, and the next
        # request is refused with the scheduler's reason.
        wait_readiness(stack, False, 5)
        with grpc.insecure_channel(stack.address("scheduler")) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
        with pytest.raises(grpc.RpcError) as second:
            stub.Generate(request, timeout=60)
        assert second.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "kvstore: unusable for more than 2 s" in second.value.details()
        stats = scheduler_stats(stack)
        assert (stats.num_running, stats.num_waiting, stats.num_blocks_held) == (0, 0, 0)
        assert stack.num_restarts["kvstore"] == 0
        assert kvstore.poll() is not None

    exits = [r.getMessage() for r in caplog.records if "not restarted" in r.getMessage()]
    assert exits == [
        "zerolayer: kvstore exited with code -9; not restarted (--no-supervise): "
        "requests that need it fail with UNAVAILABLE"
    ]
