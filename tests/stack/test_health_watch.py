"""The supervisor's health watch: a layer that stops serving while alive is logged with the reason
it gives; serving again is logged; a restarted process starts a new history."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from zerolayer.stack.health_watch import HealthTarget, HealthWatch
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Stats(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.reason = ""

    def GetStats(self, request, context):  # noqa: N802 - gRPC method name
        return scheduler_pb2.SchedulerStats(not_serving_reason=self.reason)


@pytest.fixture
def layer(tmp_path: Path):
    """A server with health (SERVING) and the scheduler's GetStats on a unix socket."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    stats = Stats()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(stats, server)
    address = f"unix:{tmp_path / 'layer.sock'}"
    server.add_insecure_port(address)
    server.start()
    servicer.set("", SERVING)
    yield address, servicer, stats
    server.stop(0)


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "zerolayer.stack.health_watch"
    ]


def test_logs_stop_with_reason_and_recovery(layer, caplog: pytest.LogCaptureFixture) -> None:
    address, servicer, stats = layer
    watch = HealthWatch({"scheduler": HealthTarget(address)}, interval_s=0.0)
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    try:
        watch.poll({"scheduler": 100})
        assert messages(caplog) == []
        stats.reason = "GPU fatal event: Xid 79 (GPU has fallen off the bus)"
        servicer.set("", NOT_SERVING)
        watch.poll({"scheduler": 100})
        watch.poll({"scheduler": 100})  # no change: logged once
        servicer.set("", SERVING)
        watch.poll({"scheduler": 100})
    finally:
        watch.close()
    assert messages(caplog) == [
        (
            logging.ERROR,
            "zerolayer: scheduler (pid 100) stopped serving: "
            "GPU fatal event: Xid 79 (GPU has fallen off the bus)",
        ),
        (logging.WARNING, "zerolayer: scheduler is serving again"),
    ]


def test_a_new_process_and_a_layer_without_reasons(layer, caplog) -> None:
    address, servicer, _ = layer
    watch = HealthWatch({"kvstore": HealthTarget(address)}, interval_s=0.0)
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    try:
        servicer.set("", NOT_SERVING)
        watch.poll({"kvstore": 1})  # first sight: nothing to compare with
        servicer.set("", SERVING)
        watch.poll({"kvstore": 2})  # a restarted process coming up: not "serving again"
        servicer.set("", NOT_SERVING)
        watch.poll({"kvstore": 2})
    finally:
        watch.close()
    assert messages(caplog) == [
        (logging.ERROR, "zerolayer: kvstore (pid 2) stopped serving: it gives no reason")
    ]


def test_unreachable_layers_are_skipped(tmp_path: Path, caplog) -> None:
    watch = HealthWatch({"loader": HealthTarget(f"unix:{tmp_path / 'none.sock'}")}, 0.0)
    try:
        watch.poll({"loader": 7})
    finally:
        watch.close()
    assert messages(caplog) == []


HEALTH_SERVER = """
import sys, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
servicer = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
server.add_insecure_port(sys.argv[1])
server.start()
servicer.set("", health_pb2.HealthCheckResponse.SERVING)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_stopped_layer_is_reported_once_and_again_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    address = f"unix:{tmp_path / 'layer.sock'}"
    process = subprocess.Popen(
        [sys.executable, "-c", HEALTH_SERVER, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n"
    clock = [0.0]
    watch = HealthWatch(
        {"scheduler": HealthTarget(address)},
        interval_s=0.0,
        unresponsive_after_s=5.0,
        clock=lambda: clock[0],
    )
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    try:
        watch.poll({"scheduler": process.pid})  # answers: SERVING
        os.kill(process.pid, signal.SIGSTOP)
        for t in (1.0, 5.9, 6.0, 9.0):  # silent from t=1; 5 s later it is reported, once
            clock[0] = t
            watch.poll({"scheduler": process.pid})
            if t == 5.9:
                assert messages(caplog) == []
        os.kill(process.pid, signal.SIGCONT)
        clock[0] = 10.0
        watch.poll({"scheduler": process.pid})
    finally:
        os.kill(process.pid, signal.SIGCONT)
        watch.close()
        process.stdin.close()
        process.wait(timeout=10)
    pid = process.pid
    assert messages(caplog) == [
        (
            logging.ERROR,
            f"zerolayer: scheduler (pid {pid}) has not answered health checks for 5 s "
            "(hung or stopped?); its process is alive",
        ),
        (logging.WARNING, f"zerolayer: scheduler (pid {pid}) answers health checks again"),
    ]


def test_a_layer_that_never_answered_is_not_reported(tmp_path: Path, caplog) -> None:
    clock = [0.0]
    target = HealthTarget(f"unix:{tmp_path / 'none.sock'}")
    watch = HealthWatch({"loader": target}, 0.0, unresponsive_after_s=5.0, clock=lambda: clock[0])
    try:
        for t in (0.0, 10.0, 100.0):  # still starting (or dying): not "unresponsive"
            clock[0] = t
            watch.poll({"loader": 7})
    finally:
        watch.close()
    assert messages(caplog) == []


def test_a_second_scheduler_is_asked_why_like_the_first(
    layer, caplog: pytest.LogCaptureFixture
) -> None:
    address, servicer, stats = layer
    watch = HealthWatch({"scheduler-1": HealthTarget(address, layer="scheduler")}, interval_s=0.0)
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    try:
        watch.poll({"scheduler-1": 7})
        stats.reason = "GPU fatal event: Xid 79"
        servicer.set("", NOT_SERVING)
        watch.poll({"scheduler-1": 7})
    finally:
        watch.close()
    assert messages(caplog) == [
        (logging.ERROR, "zerolayer: scheduler-1 (pid 7) stopped serving: GPU fatal event: Xid 79")
    ]


def test_a_restarted_process_that_serves_after_its_start_up_is_not_reported(
    layer, caplog: pytest.LogCaptureFixture
) -> None:
    address, servicer, _ = layer
    watch = HealthWatch({"scheduler": HealthTarget(address)}, interval_s=0.0)
    caplog.set_level(logging.INFO, logger="zerolayer.stack.health_watch")
    try:
        watch.poll({"scheduler": 100})
        servicer.set("", NOT_SERVING)  # pid 101: the restarted one, warming up
        watch.poll({"scheduler": 101})
        servicer.set("", SERVING)
        watch.poll({"scheduler": 101})
    finally:
        watch.close()
    assert messages(caplog) == []
