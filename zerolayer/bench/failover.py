"""Failover: kill -9 of a scheduler under greedy and seeded streams, with and without a standby.

For each case (no standby, one standby) a stack is started with ``--schedulers N`` and the streams
run twice, each run under its own cache salt (no prefix shared between runs): once undisturbed
(the reference outputs) and once with a ``kill -9`` of the scheduler carrying the most running
requests, as soon as every stream has ``--kill-after-tokens`` tokens. Recorded per case: failed
requests (goal 0), outputs identical to the undisturbed run (goal all), the longest gap between
two tokens of any stream (goal with a standby: at most 250 ms), and the time from the kill until
a new request is admitted (its first token arrives).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from zerolayer.bench.common import write_results
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import (
    add_threads_argument,
    model_dir_for,
    stack_config,
    vocab_size_of,
    warm_up,
    zerolayer_threads,
)
from zerolayer.bench.streams import random_prompts
from zerolayer.cli.arg_types import at_least
from zerolayer.common.settings import BATCH_INVARIANT, MAX_NUM_SEQS
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

HELP = "kill -9 of a scheduler under streams, with and without a standby"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {
    "num_greedy": 2,
    "num_seeded": 2,
    "prompt_tokens": 16,
    "max_new_tokens": 24,
    "kill_after_tokens": 4,
}
"""Overrides of ``--smoke``."""
CASES = {"no_standby": 0, "standby": 1}
"""Case name -> ``--standby-schedulers``."""
PROBE_SEED = 20_000
"""Seed of the prompt that probes admission after the kill (shared with no stream)."""
MAX_GAP_GOAL_S = 0.25
"""The issue's goal for the longest inter-token gap with a standby, seconds."""


@dataclass
class StreamRecord:
    """One stream as the client saw it (filled by its thread while it runs)."""

    token_ids: list[int] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    """perf_counter reading per token."""
    error: str = ""
    """The gRPC status code's name if the call failed, else ""."""

    def max_gap_s(self) -> float:
        a = self.arrivals_s
        return max((b - x for x, b in zip(a, a[1:], strict=False)), default=0.0)


def stream_requests(prompts: Sequence[list[int]], args: argparse.Namespace, salt: str) -> list:
    """The greedy requests, then the seeded ones (temperature 1, seed 1000 + index)."""
    requests = []
    for i, prompt in enumerate(prompts):
        request = pb.GenerateRequest(
            prompt_token_ids=pb.TokenIds(ids=prompt),
            max_new_tokens=args.max_new_tokens,
            ignore_eos=True,
            cache_salt=salt,
        )
        if i >= args.num_greedy:
            request.temperature = 1.0
            request.seed = 1000 + i
        requests.append(request)
    return requests


def start_streams(
    channel: grpc.Channel, requests: Sequence[pb.GenerateRequest]
) -> tuple[list[StreamRecord], list[threading.Thread]]:
    """Starts one GenerateStream per request on ``channel``, each on its own thread.

    Returns:
        The records (filled as tokens arrive) and the threads (join them before the channel
        closes).
    """
    stub = generation_pb2_grpc.TextGenerationStub(channel)
    records = [StreamRecord() for _ in requests]

    def run(request: pb.GenerateRequest, record: StreamRecord) -> None:
        try:
            for part in stub.GenerateStream(request, timeout=600):
                now = time.perf_counter()
                record.arrivals_s.extend([now] * len(part.token_ids))
                record.token_ids.extend(part.token_ids)
        except grpc.RpcError as exc:
            record.error = exc.code().name

    threads = [
        threading.Thread(target=run, args=(r, rec), daemon=True)
        for r, rec in zip(requests, records, strict=True)
    ]
    for thread in threads:
        thread.start()
    return records, threads


def busiest_scheduler(stack: Stack) -> str:
    """The live scheduler with the most running requests (the first on a tie)."""
    running = {}
    for name in stack.scheduler_names():
        with grpc.insecure_channel(stack.address(name)) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                stats = stub.GetStats(scheduler_pb2.SchedulerStatsRequest(), timeout=2)
            except grpc.RpcError:
                continue
        running[name] = stats.num_running + stats.num_waiting
    return max(running, key=lambda name: running[name])


def time_to_admission(address: str, prompt: list[int], since: float, timeout_s: float) -> float:
    """Seconds from ``since`` (perf_counter) until a new one-token request succeeds; retried
    every 20 ms while calls fail. -1.0: none succeeded within ``timeout_s``."""
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=prompt), max_new_tokens=1, ignore_eos=True
    )
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        while time.perf_counter() - since < timeout_s:
            try:
                stub.Generate(request, timeout=timeout_s)
                return time.perf_counter() - since
            except grpc.RpcError:
                time.sleep(0.02)
    return -1.0


def killed_run(stack: Stack, requests: list, probe: list[int], args: argparse.Namespace) -> dict:
    """Runs the streams and kills the busiest scheduler once each has ``kill_after_tokens``."""
    with grpc.insecure_channel(stack.config.listen) as channel:
        records, threads = start_streams(channel, requests)
        deadline = time.perf_counter() + 300
        while time.perf_counter() < deadline:
            if all(len(r.token_ids) >= args.kill_after_tokens or r.error for r in records):
                break
            time.sleep(0.005)
        victim = busiest_scheduler(stack)
        pid = stack.processes[victim].pid
        killed_at = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        admission_s = time_to_admission(stack.config.listen, probe, killed_at, 120)
        for thread in threads:
            thread.join()
    return {"records": records, "killed": victim, "killed_pid": pid, "admission_s": admission_s}


def undisturbed_run(stack: Stack, requests: list) -> list[StreamRecord]:
    """Runs the streams to their end."""
    with grpc.insecure_channel(stack.config.listen) as channel:
        records, threads = start_streams(channel, requests)
        for thread in threads:
            thread.join()
    return records


def summary(records: list[StreamRecord], reference: list[StreamRecord]) -> dict:
    """What the killed run lost against the undisturbed one."""
    failed = [r for r in records if r.error]
    survived = [r for r in records if not r.error]
    identical = sum(
        1
        for r, ref in zip(records, reference, strict=True)
        if not r.error and r.token_ids == ref.token_ids
    )
    return {
        "failed_requests": len(failed),
        "failure_codes": dict(Counter(r.error for r in failed)),
        "identical_outputs": identical,
        "num_requests": len(records),
        "max_gap_s": max((r.max_gap_s() for r in survived), default=0.0),
        "max_gap_s_undisturbed": max(r.max_gap_s() for r in reference),
    }


def run_case(
    name: str, standby: int, args: argparse.Namespace, prompts: list, vocab: int
) -> tuple[dict, list[list[int]]]:
    """One stack with ``standby`` standby schedulers: the undisturbed run, then the killed run.

    Returns:
        The case's results, and the undisturbed outputs (token ids per stream).

    Raises:
        RuntimeError: a request of the undisturbed run failed.
    """
    config = stack_config(
        args,
        model_dir_for(args),
        log_dir=str(args.out / "logs" / name),
        schedulers=args.schedulers,
        standby_schedulers=standby,
        max_num_seqs=max(MAX_NUM_SEQS.default, len(prompts) + 1),
        batch_invariant=args.batch_invariant,
    )
    with Stack(config) as stack:
        warm_up(config.listen, vocab)
        reference = undisturbed_run(stack, stream_requests(prompts, args, f"{name}-undisturbed"))
        if any(r.error for r in reference):
            raise RuntimeError(
                f"{name}: the undisturbed run failed: {[r.error for r in reference]}"
            )
        probe = random_prompts(1, 8, vocab, seed=PROBE_SEED)[0]
        run = killed_run(stack, stream_requests(prompts, args, f"{name}-killed"), probe, args)
    results = {
        "standby_schedulers": standby,
        "killed": run["killed"],
        **summary(run["records"], reference),
        "admission_after_kill_s": run["admission_s"],
    }
    return results, [r.token_ids for r in reference]


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    model_dir = model_dir_for(args)
    vocab = vocab_size_of(model_dir)
    prompts = random_prompts(args.num_greedy + args.num_seeded, args.prompt_tokens, vocab, seed=0)
    runs = {name: run_case(name, k, args, prompts, vocab) for name, k in CASES.items()}
    cases = {name: case for name, (case, _) in runs.items()}
    references = [reference for _, reference in runs.values()]
    standby = cases["standby"]
    results = {
        "model": str(model_dir),
        "workload": {
            "num_greedy": args.num_greedy,
            "num_seeded": args.num_seeded,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "kill_after_tokens": args.kill_after_tokens,
            "ignore_eos": True,
        },
        "stack": {
            "schedulers": args.schedulers,
            "torch_threads_each": zerolayer_threads(args),
            "batch_invariant": args.batch_invariant,
        },
        "cases": cases,
        "undisturbed_outputs_equal_across_cases": all(r == references[0] for r in references),
        "goals": {
            "failed_requests": 0,
            "identical_outputs": "all",
            "max_gap_s_with_standby": MAX_GAP_GOAL_S,
        },
        "goals_met": {
            "failed_requests": all(c["failed_requests"] == 0 for c in cases.values()),
            "identical_outputs": all(
                c["identical_outputs"] == c["num_requests"] for c in cases.values()
            ),
            "max_gap_s_with_standby": standby["failed_requests"] == 0
            and standby["max_gap_s"] <= MAX_GAP_GOAL_S,
        },
    }
    plot_bars(
        args.out / "failover.png",
        f"kill -9 of a scheduler under {len(prompts)} streams",
        {
            "longest gap between two tokens (s)": {n: c["max_gap_s"] for n, c in cases.items()},
            "kill to a new request admitted (s)": {
                n: c["admission_after_kill_s"] for n, c in cases.items()
            },
            "failed requests": {n: float(c["failed_requests"]) for n, c in cases.items()},
        },
    )
    return write_results(args, "failover", results)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--num-greedy", type=at_least(1), default=16, help="greedy streams")
    p.add_argument(
        "--num-seeded", type=at_least(1), default=16, help="seeded streams (temperature 1)"
    )
    p.add_argument("--prompt-tokens", type=at_least(1), default=64)
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument(
        "--kill-after-tokens",
        type=at_least(1),
        default=32,
        help="kill -9 the busiest scheduler once every stream has this many tokens",
    )
    p.add_argument(
        "--schedulers", type=at_least(1), default=2, help="active schedulers of the stacks"
    )
    p.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=BATCH_INVARIANT.default,
        help="run the schedulers with --batch-invariant (identical outputs after a failover "
        "need it on the CPU); default: the product's default (off), as a user gets it",
    )
    add_threads_argument(p)
