"""Two schedulers on one kvstore, as processes: the prefix index is shared between them, and the
references of a scheduler killed with SIGKILL are released once its lease expires."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e.stack import generate_ids, kv_stats, running_stack, text_stub

from zerolayer.stack.launcher import Stack
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

pytestmark = pytest.mark.e2e

LEASE_S = 1.0
PROMPT = [1, *[(11 * i) % 250 + 3 for i in range(80)]]  # 81 tokens: 5 full blocks of 16


@pytest.fixture(scope="module")
def stack(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("logs")
    with running_stack(dummy_model_dir, logs, owner_lease_s=LEASE_S) as s:
        yield s


def start_scheduler(stack: Stack, name: str) -> tuple[subprocess.Popen, str]:
    """A second scheduler process on the stack's loader and kvstore (the stack's own scheduler
    is the first); returns it and its address."""
    address = f"unix:{stack.run_dir / f'{name}.sock'}"
    command = stack.command("scheduler")
    command[command.index("--address") + 1] = address
    log = open(Path(stack.config.log_dir) / f"{name}.log", "w")  # noqa: SIM115 - the child's
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:  # the engine answers UNAVAILABLE until it has started
            try:
                stub.GetStats(scheduler_pb2.SchedulerStatsRequest(), timeout=5, wait_for_ready=True)
                return process, address
            except grpc.RpcError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)


def engine_request(request_id: str, max_new_tokens: int) -> scheduler_pb2.EngineRequest:
    return scheduler_pb2.EngineRequest(
        request_id=request_id,
        prompt_token_ids=PROMPT,
        max_new_tokens=max_new_tokens,
        sampling=scheduler_pb2.SamplingParams(temperature=0.0, top_p=1.0),
        ignore_eos=True,
        cache_salt="owners",
    )


def owners(stack: Stack) -> dict[str, object]:
    return {o.owner_id: o for o in kv_stats(stack).owners}


def test_a_prefix_computed_via_one_scheduler_is_a_hit_via_another(stack: Stack) -> None:
    first = generate_ids(text_stub(stack), PROMPT, 4, "owners")  # via the stack's scheduler
    assert first.usage.cached_prompt_tokens == 0
    process, address = start_scheduler(stack, "scheduler-b")
    try:
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            outputs = list(stub.Generate(engine_request("b-1", 4), timeout=60))
        assert outputs[-1].num_cached_tokens == 80  # 5 full blocks committed via the other
        assert [t for o in outputs for t in o.new_token_ids] == list(first.token_ids)
        stats = owners(stack)
        assert set(stats) == {stack.address("scheduler"), address}
        assert all(o.epoch >= 1 and o.reconciled and not o.lease_expired for o in stats.values())
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_the_references_of_a_killed_scheduler_are_released_when_its_lease_expires(
    stack: Stack,
) -> None:
    process, address = start_scheduler(stack, "scheduler-c")
    streaming = threading.Event()

    def stream() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                for _ in stub.Generate(engine_request("c-1", 200), timeout=60):
                    streaming.set()
            except grpc.RpcError:
                pass  # the scheduler was killed

    thread = threading.Thread(target=stream)
    thread.start()
    assert streaming.wait(60)
    held = owners(stack)[address]
    assert held.num_blocks_held > 0 and not held.lease_expired
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    thread.join(10)
    killed_at = time.monotonic()
    deadline = killed_at + 10 * LEASE_S
    while not owners(stack)[address].lease_expired and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = owners(stack)[address]
    assert gone.lease_expired and gone.num_blocks_held == 0
    assert time.monotonic() - killed_at < 3 * LEASE_S
    stats = kv_stats(stack)
    # Nothing runs: every block is free, the prompt's blocks still cached.
    assert stats.num_blocks_used == 0 and stats.num_blocks_free == stats.num_blocks_total
    assert stats.num_owners == 1  # the stack's scheduler
    again = generate_ids(text_stub(stack), PROMPT, 4, "owners")
    assert again.usage.cached_prompt_tokens == 80


def test_a_scheduler_stopped_longer_than_its_lease_recomputes_and_answers_the_same(
    stack: Stack,
) -> None:
    process, address = start_scheduler(stack, "scheduler-d")
    try:
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            undisturbed = [
                t
                for o in stub.Generate(engine_request("d-1", 300), timeout=60)
                for t in o.new_token_ids
            ]
            tokens: list[int] = []
            for output in stub.Generate(engine_request("d-2", 300), timeout=60):
                tokens += output.new_token_ids
                if len(tokens) >= 5 > len(tokens) - len(output.new_token_ids):
                    # Stopped mid-stream for longer than its lease: the kvstore releases its
                    # references; back, it must not write into them but recompute.
                    os.kill(process.pid, signal.SIGSTOP)
                    time.sleep(2.5 * LEASE_S)
                    assert owners(stack)[address].lease_expired
                    os.kill(process.pid, signal.SIGCONT)
            stats = stub.GetStats(scheduler_pb2.SchedulerStatsRequest(), timeout=5)
        assert tokens == undisturbed
        assert stats.num_preemptions >= 1
        back = owners(stack)[address]
        assert back.epoch == 2 and not back.lease_expired
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
