"""Timing process start-ups from the outside: import cost, readiness, and the first token.

Readiness is polled on a fresh channel per attempt: a reused channel that failed to connect waits
out gRPC's reconnect backoff (up to seconds), which would be measured instead of the process.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.bench.streams import generate_request
from zerolayer.v1 import generation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

POLL_S = 0.01
"""Pause between attempts (the resolution of every readiness time)."""


def poll(attempt: Callable[[], float | None], alive: Callable[[], bool], timeout_s: float) -> float:
    """Calls ``attempt`` until it returns a time (perf_counter), pausing ``POLL_S`` between calls.

    Raises:
        RuntimeError: ``alive()`` turned false or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the process under test exited")
        at = attempt()
        if at is not None:
            return at
        time.sleep(POLL_S)
    raise RuntimeError(f"not ready within {timeout_s} s")


def first_token_via_frontend(address: str, prompt: Sequence[int]) -> float | None:
    """One GenerateStream attempt; the first token's arrival, or None if it failed."""
    try:
        with grpc.insecure_channel(address) as channel:
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            for part in stub.GenerateStream(generate_request(prompt, 1), timeout=60):
                if part.token_ids:
                    return time.perf_counter()
    except grpc.RpcError:
        pass
    return None


def first_token_from_scheduler(address: str, prompt: Sequence[int]) -> float | None:
    """One attempt of the scheduler's own Generate (no frontend); first token's arrival or None."""
    request = scheduler_pb2.EngineRequest(
        request_id=f"coldstart-{uuid.uuid4().hex}",
        prompt_token_ids=list(prompt),
        max_new_tokens=1,
        sampling=scheduler_pb2.SamplingParams(),
        ignore_eos=True,
    )
    try:
        with grpc.insecure_channel(address) as channel:
            for part in scheduler_pb2_grpc.SchedulerStub(channel).Generate(request, timeout=60):
                if part.new_token_ids:
                    return time.perf_counter()
    except grpc.RpcError:
        pass
    return None


def serving_now(address: str) -> float | None:
    """One health check (overall service); its answer's time if SERVING, else None."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
    except grpc.RpcError:
        return None
    return time.perf_counter() if reply.status == health_pb2.HealthCheckResponse.SERVING else None


def import_seconds() -> float:
    """Wall time of a fresh ``python -c "import torch, grpc"``: interpreter start and the imports
    every layer pays before it can do anything model-dependent."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, grpc"], check=True)
    return time.perf_counter() - start
