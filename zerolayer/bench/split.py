"""The cost of the split: the same engine in-process (a library, no gRPC) vs through the services.

In-process, requests are submitted straight to the Engine and their tokens timed as they leave the
engine thread; through the services, the same prompts go over gRPC to the frontend, which calls
the scheduler, and are timed by the client. Decode tok/s and ITL p50 at each batch size.
"""

from __future__ import annotations

import argparse

from zerolayer.bench.common import median, percentile, write_results
from zerolayer.bench.cpu_time import CpuMeter
from zerolayer.bench.inprocess import LocalEngineClient, local_engine_for_stack
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import (
    WARMUP_SEED,
    add_batch_sizes_argument,
    add_threads_argument,
    measured_threads,
    model_dir_for,
    set_torch_threads,
    stack_config,
    vocab_size_of,
    warm_up,
)
from zerolayer.bench.streams import (
    TokenTimes,
    decode_tok_s,
    generate_request,
    pooled_itl_s,
    random_prompts,
    run_streams,
)
from zerolayer.cli.arg_types import at_least
from zerolayer.scheduler.core.engine import call_in_fresh_thread
from zerolayer.stack.config import StackConfig
from zerolayer.stack.launcher import Stack

HELP = "the same engine in process and through the four services: decode tok/s, ITL"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {"batch_sizes": "1,4", "prompt_tokens": 16, "max_new_tokens": 64, "repeats": 1}
"""Overrides of ``--smoke``."""


def workload(batch_sizes: list[int], vocab_size: int, args: argparse.Namespace) -> dict:
    """Prompts per batch size and repeat (distinct, so nothing is a prefix-cache hit)."""
    return {
        b: [
            random_prompts(b, args.prompt_tokens, vocab_size, seed=1000 * b + r)
            for r in range(args.repeats)
        ]
        for b in batch_sizes
    }


def summary(runs_per_repeat: list[list[TokenTimes]]) -> dict:
    """Median decode rate over repeats and the ITL p50 of all their gaps."""
    itls = [gap for runs in runs_per_repeat for gap in pooled_itl_s(runs)]
    return {
        "decode_tok_s": median([decode_tok_s(runs) for runs in runs_per_repeat]),
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
    }


def run_in_process(
    config: StackConfig, prompts: dict, vocab_size: int, args: argparse.Namespace
) -> dict:
    """Every batch size on one engine in this process: the engine the stack ``config`` runs."""
    # As the scheduler process does: build on a thread that exits, warm up on the engine thread
    # (one OpenMP pool in the process; see zerolayer.scheduler.core.engine).
    engine = call_in_fresh_thread(local_engine_for_stack, config)
    engine.start(warm_up_tokens=32)
    try:
        client = LocalEngineClient(engine)
        client.run(random_prompts(2, 32, vocab_size, WARMUP_SEED), 4)
        return {
            str(b): summary([client.run(p, args.max_new_tokens) for p in repeats])
            for b, repeats in prompts.items()
        }
    finally:
        engine.stop()


def run_services(
    address: str, pids: dict[str, int], prompts: dict, args: argparse.Namespace
) -> dict:
    """Every batch size through the four layers, all requests of a batch sent at once; with the
    CPU milliseconds each layer process and the client spent per generated token."""

    def batch(ps: list[list[int]]) -> list[TokenTimes]:
        return run_streams(
            address, [generate_request(p, args.max_new_tokens) for p in ps], [0.0] * len(ps)
        )

    out = {}
    for b, repeats in prompts.items():
        meter = CpuMeter(pids)
        runs = [batch(p) for p in repeats]
        cpu_s = meter.read()
        num_tokens = sum(len(r.arrivals_s) for runs_ in runs for r in runs_)
        out[str(b)] = {
            **summary(runs),
            "cpu_ms_per_token": {name: s * 1e3 / num_tokens for name, s in cpu_s.items()},
        }
    return out


def comparison(in_process: dict, services: dict) -> dict:
    """Per batch size: services / in-process decode rate and the ITL p50 overhead (ms)."""
    out = {}
    for b, local in in_process.items():
        ratio = services[b]["decode_tok_s"] / local["decode_tok_s"]
        overhead_ms = (services[b]["itl_p50_s"] - local["itl_p50_s"]) * 1e3
        out[b] = {
            "services_vs_in_process_decode_tok_s": ratio,
            "itl_p50_overhead_ms": overhead_ms,
            "targets_met": {
                "decode_tok_s_ratio": ratio >= 0.95,
                "itl_p50_overhead": overhead_ms <= 0.5,
            },
        }
    return out


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    threads = measured_threads(args)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    prompts = workload(batch_sizes, vocab_size, args)
    set_torch_threads(threads)
    # NOTE: both sides run the same engine with the same thread count (not the default).
    config = stack_config(args, model_dir, num_threads=threads)
    in_process = run_in_process(config, prompts, vocab_size, args)
    with Stack(config) as stack:
        warm_up(config.listen, vocab_size)
        pids = {layer: process.pid for layer, process in stack.processes.items()}
        services = run_services(config.listen, pids, prompts, args)
    results = {
        "model": str(model_dir),
        "workload": {
            "batch_sizes": batch_sizes,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "decode_tok_s": "tokens arriving while every request of the batch decodes (after "
            "the last first token, up to the first last token) per second; median of repeats",
            "in_process_timing": "when the engine thread hands each token to the request's sink",
            "services_timing": "when the gRPC client receives each token from the frontend",
            "cpu_ms_per_token": "CPU time (user + system, all threads) of each layer process "
            "and of the benchmark client over the batch's repeats, per generated token",
        },
        "torch_threads": {"in_process_engine": threads, "zerolayer_scheduler": threads},
        "in_process": in_process,
        "services": services,
        "comparison": comparison(in_process, services),
        "targets": {"decode_tok_s_ratio": ">= 0.95", "itl_p50_overhead": "<= 0.5 ms"},
    }
    plot_bars(
        args.out / "split.png",
        "Same engine: in-process vs four services",
        {
            "decode tokens/s": {
                f"{side} b={b}": r[str(b)]["decode_tok_s"]
                for b in batch_sizes
                for side, r in (("in-process", in_process), ("services", services))
            },
            "ITL p50 (ms)": {
                f"{side} b={b}": r[str(b)]["itl_p50_s"] * 1e3
                for b in batch_sizes
                for side, r in (("in-process", in_process), ("services", services))
            },
        },
    )
    return write_results(args, "split", results)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    add_batch_sizes_argument(p)
    p.add_argument("--prompt-tokens", type=at_least(1), default=128)
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument("--repeats", type=at_least(1), default=3, help="runs per batch size (medians)")
    add_threads_argument(p)
