"""End to end with several schedulers and frontends: ``zerolayer up --schedulers 2
--standby-schedulers 1 --frontends 2`` on the dummy model (tiny preset), one stack for the module.

The tests run in file order: the last ones kill processes.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from e2e.stack import free_port, running_stack, text_stub
from prometheus_client.parser import text_string_to_metric_families
from sharing.test_mapped_file import smaps_entry

from zerolayer.common.scheduler_role import SchedulerRole
from zerolayer.stack.probes import is_serving
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

pytestmark = pytest.mark.e2e

SERVICE = "zerolayer.v1.Scheduler"


@pytest.fixture(scope="module")
def stack(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with running_stack(
        dummy_model_dir,
        tmp_path_factory.mktemp("logs"),
        max_num_batched_tokens=48,
        schedulers=2,
        standby_schedulers=1,
        frontends=2,
        metrics_port_base=free_port(),
    ) as stack:
        yield stack


def generate(address: str, prompt: str = "Once upon") -> pb.GenerateResponse:
    """One greedy Generate of 8 tokens on a new channel (a new client)."""
    with grpc.insecure_channel(address) as channel:
        return generation_pb2_grpc.TextGenerationStub(channel).Generate(
            pb.GenerateRequest(prompt=prompt, max_new_tokens=8, ignore_eos=True), timeout=30
        )


def role(stack, name: str) -> SchedulerRole:
    with grpc.insecure_channel(stack.address(name)) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(
            scheduler_pb2.SchedulerStatsRequest(), timeout=5
        )
    return SchedulerRole(stats.role)


def wait_until(condition, timeout_s: float) -> float:
    """Polls ``condition`` every 10 ms; returns the seconds it took. Fails after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def test_the_stack_runs_its_processes_each_on_its_own_socket(stack) -> None:
    assert list(stack.processes) == [
        "loader",
        "kvstore",
        "scheduler",
        "scheduler-1",
        "scheduler-2",
        "frontend",
        "frontend-1",
    ]
    sockets = {path.name for path in stack.run_dir.glob("*.sock")}
    assert {"scheduler.sock", "scheduler-1.sock", "scheduler-2.sock"} <= sockets
    assert stack.standby == {"scheduler-2"}


def test_active_schedulers_serve_and_the_standby_waits(stack) -> None:
    for name in ("scheduler", "scheduler-1"):
        assert is_serving(stack.address(name), "") and is_serving(stack.address(name), SERVICE)
        assert role(stack, name) is SchedulerRole.ACTIVE
    standby = stack.address("scheduler-2")
    assert is_serving(standby, "")  # warmed
    assert not is_serving(standby, SERVICE)
    assert role(stack, "scheduler-2") is SchedulerRole.STANDBY


def scheduler_gauge(stack, name: str, metric: str) -> float:
    """The value of the unlabelled gauge ``metric`` on the /metrics endpoint of ``name``."""
    url = f"http://127.0.0.1:{stack.config.metrics_port(name)}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == metric]
    return family.samples[0].value


def test_the_serving_gauge_is_the_scheduler_services_health(stack) -> None:
    serving = {
        name: scheduler_gauge(stack, name, "zerolayer_scheduler_serving")
        for name in ("scheduler", "scheduler-1", "scheduler-2")
    }
    assert serving == {"scheduler": 1, "scheduler-1": 1, "scheduler-2": 0}


def test_generate_answers_on_the_shared_port(stack) -> None:
    first = generate(stack.config.listen)
    assert len(first.token_ids) == 8
    assert generate(stack.config.listen).token_ids == first.token_ids


def test_the_schedulers_map_one_copy_of_the_weights(stack, dummy_model_dir: Path) -> None:
    generate(stack.config.listen)
    (weight_file,) = [str(p.resolve()) for p in dummy_model_dir.glob("*.safetensors")]
    for name in ("scheduler", "scheduler-1", "scheduler-2"):
        entry = smaps_entry(stack.processes[name].pid, weight_file)
        assert entry["Rss"] > 0, name
        assert entry["Anonymous"] == 0, name  # no copy-on-write copies
        assert entry["Private_Dirty"] == 0, name
        assert entry["Private_Clean"] == 0, name  # every page is mapped by another process
        assert entry["Pss"] * 2 <= entry["Rss"], name  # at least two sharers of each page


def test_each_frontend_answers_on_its_own_address(stack) -> None:
    for name in ("frontend", "frontend-1"):
        assert stack.private_address(name) == f"unix:{stack.run_dir / name}.sock"
        assert len(generate(stack.private_address(name)).token_ids) == 8


def test_a_killed_frontend_fails_no_new_call_and_is_restarted(stack) -> None:
    old_pid = stack.processes["frontend-1"].pid
    stack.processes["frontend-1"].kill()
    stack.processes["frontend-1"].wait()
    for _ in range(8):  # new clients, spread by the kernel over the live listeners
        assert len(generate(stack.config.listen).token_ids) == 8
    wait_until(lambda: stack.processes["frontend-1"].pid != old_pid, 10)
    stack.wait_healthy("frontend-1", time.monotonic() + 60)
    assert len(generate(stack.private_address("frontend-1")).token_ids) == 8


def test_a_killed_active_scheduler_is_replaced_by_the_standby(stack) -> None:
    old_pid = stack.processes["scheduler"].pid
    standby = stack.address("scheduler-2")
    stack.processes["scheduler"].kill()  # SIGKILL
    took_s = wait_until(lambda: is_serving(standby, SERVICE), 5)
    assert took_s < 2
    assert role(stack, "scheduler-2") is SchedulerRole.ACTIVE
    # The supervisor records the swap once Activate has answered (the standby serves a moment
    # before that).

    def swapped() -> bool:
        with stack.lock:
            return stack.standby == {"scheduler"}

    wait_until(swapped, 2)
    # The dead slot restarts as the new standby.
    wait_until(lambda: stack.processes["scheduler"].pid != old_pid, 10)
    stack.wait_healthy("scheduler", time.monotonic() + 120)
    assert not is_serving(stack.address("scheduler"), SERVICE)
    assert role(stack, "scheduler") is SchedulerRole.STANDBY
    assert scheduler_gauge(stack, "scheduler", "zerolayer_scheduler_serving") == 0
    assert scheduler_gauge(stack, "scheduler-2", "zerolayer_scheduler_serving") == 1
    assert len(generate(stack.config.listen).token_ids) == 8


def test_stream_still_works_through_the_public_port(stack) -> None:
    stub = text_stub(stack)
    parts = list(
        stub.GenerateStream(
            pb.GenerateRequest(prompt="tail", max_new_tokens=5, ignore_eos=True), timeout=30
        )
    )
    assert sum(len(part.token_ids) for part in parts) == 5
