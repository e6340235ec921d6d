"""Per-token timing of requests: prompts, gRPC streams sent on a schedule, and decode rates.

Every time is a ``time.perf_counter()`` reading in seconds (CLOCK_MONOTONIC on Linux). The client
side stays light on purpose: while zerolayer is measured, the bench process only waits on sockets.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from zerolayer.checkpoints.byte_tokenizer import BYTE_VOCAB_SIZE
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

T = TypeVar("T")

FIRST_PROMPT_ID = 3
"""Prompt ids start above the byte tokenizer's special tokens (BOS 1, EOS 2)."""


@dataclass(frozen=True)
class TokenTimes:
    """When one request was sent and when each of its tokens arrived."""

    send_s: float
    arrivals_s: tuple[float, ...]
    """One reading per generated token, in order (tokens that came in one message share it)."""

    @property
    def ttft_s(self) -> float:
        """Send to the first token."""
        return self.arrivals_s[0] - self.send_s

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Gaps between consecutive tokens."""
        a = self.arrivals_s
        return tuple(b - x for x, b in zip(a, a[1:], strict=False))

    @property
    def e2e_s(self) -> float:
        """Send to the last token."""
        return self.arrivals_s[-1] - self.send_s


def num_cores() -> int:
    """CPU cores this process may run on (what every measured side gets as torch threads)."""
    return len(os.sched_getaffinity(0))


def random_prompts(
    num_prompts: int, num_tokens: int, vocab_size: int, seed: int
) -> list[list[int]]:
    """Seeded random prompts of ids in [3, min(vocab_size, 259)): known to the byte tokenizer."""
    rng = random.Random(seed)
    high = min(vocab_size, BYTE_VOCAB_SIZE)
    return [
        [rng.randrange(FIRST_PROMPT_ID, high) for _ in range(num_tokens)]
        for _ in range(num_prompts)
    ]


def generate_request(prompt: Sequence[int], max_new_tokens: int) -> pb.GenerateRequest:
    """A greedy request for exactly ``max_new_tokens`` tokens (EOS ignored), ids sent as is."""
    return pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=list(prompt)),
        max_new_tokens=max_new_tokens,
        ignore_eos=True,
    )


def stream_token_times(
    stub: generation_pb2_grpc.TextGenerationStub,
    request: pb.GenerateRequest,
    timeout_s: float = 600,
) -> TokenTimes:
    """Runs one GenerateStream call and records the arrival of each token.

    Raises:
        grpc.RpcError: the call failed.
        RuntimeError: the stream carried no token.
    """
    send = time.perf_counter()
    arrivals: list[float] = []
    for part in stub.GenerateStream(request, timeout=timeout_s):
        if part.token_ids:
            arrivals.extend([time.perf_counter()] * len(part.token_ids))
    if not arrivals:
        raise RuntimeError("the stream carried no token")
    return TokenTimes(send, tuple(arrivals))


def run_scheduled(send: Callable[[int], T], offsets_s: Sequence[float]) -> list[T]:
    """Calls ``send(i)`` ``offsets_s[i]`` seconds after the start, each on its own thread, and
    waits for all of them; returns what each returned.

    Raises:
        BaseException: the first failed call's error, after all have ended.
    """
    results: list[T | BaseException | None] = [None] * len(offsets_s)
    start = time.perf_counter()

    def run(i: int) -> None:
        delay = start + offsets_s[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            results[i] = send(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(offsets_s))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def run_streams(
    address: str, requests: Sequence[pb.GenerateRequest], offsets_s: Sequence[float]
) -> list[TokenTimes]:
    """Sends request i ``offsets_s[i]`` seconds after the start, each on its own thread over one
    shared channel, and waits for all of them (:func:`run_scheduled`).

    Raises:
        grpc.RpcError | RuntimeError: the first failed request's error, after all have ended.
    """
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        return run_scheduled(lambda i: stream_token_times(stub, requests[i]), offsets_s)


def decode_tok_s(runs: Sequence[TokenTimes]) -> float:
    """Steady-state decode rate of requests run together: tokens arriving after the last request's
    first token and up to the first request's last token, per second of that window.

    Only decode steps fall in the window (every request has been prefilled and none has finished),
    so prefill chunks and the batch's ramp-up and drain do not count. 0.0 when the window is empty.
    """
    t0 = max(r.arrivals_s[0] for r in runs)
    t1 = min(r.arrivals_s[-1] for r in runs)
    if t1 <= t0:
        return 0.0
    num_tokens = sum(1 for r in runs for t in r.arrivals_s if t0 < t <= t1)
    return num_tokens / (t1 - t0)


def pooled_itl_s(runs: Sequence[TokenTimes]) -> list[float]:
    """Every inter-token gap of every request."""
    return [gap for r in runs for gap in r.itl_s]
