"""Online latency: Poisson arrivals at several rates, TTFT and ITL percentiles per rate.

Each rate sends a fixed number of requests with exponential inter-arrival gaps from a seeded RNG,
streamed over gRPC and timed by the client; then the TTFT of single long prompts on the idle stack.
From a checkout, the baseline is transformers' batch-1 ``generate`` of prompts of the same length
(``benchmarks/hf/latency.py``): one request, no queueing (what a single user gets).
"""

from __future__ import annotations

import argparse
import random

from zerolayer.bench.checkout import baseline_for, compared
from zerolayer.bench.common import median, percentile, stub_for, write_results
from zerolayer.bench.plots import plot_line_panels
from zerolayer.bench.scenario import (
    add_threads_argument,
    model_dir_for,
    stack_config,
    vocab_size_of,
    warm_up,
    zerolayer_threads,
)
from zerolayer.bench.streams import (
    TokenTimes,
    generate_request,
    pooled_itl_s,
    random_prompts,
    run_streams,
    stream_token_times,
)
from zerolayer.cli.arg_types import at_least, comma_separated, positive
from zerolayer.stack.launcher import Stack

HELP = "Poisson arrivals at several rates: TTFT and ITL percentiles"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {
    "rates": "4,8,16",
    "num_requests": 4,
    "prompt_tokens": 16,
    "max_new_tokens": 8,
    "isolated_repeats": 1,
    "isolated_prompt_tokens": 16,
}
"""Overrides of ``--smoke``."""


def poisson_offsets(rate_per_s: float, num_requests: int, seed: int) -> list[float]:
    """Send times (s after the start) of a Poisson process: the first at 0, then exponential gaps
    of mean ``1 / rate_per_s``."""
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(num_requests - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate_per_s))
    return offsets


def latency_summary(runs: list[TokenTimes]) -> dict:
    """TTFT and ITL percentiles (s), end-to-end median, and the achieved output rate."""
    ttfts = [r.ttft_s for r in runs]
    itls = pooled_itl_s(runs)
    span = max(r.arrivals_s[-1] for r in runs) - min(r.send_s for r in runs)
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
        "e2e_p50_s": median([r.e2e_s for r in runs]),
        "output_tok_s": sum(len(r.arrivals_s) for r in runs) / span,
    }


def run_zerolayer(
    address: str, rates: list[float], vocab_size: int, args: argparse.Namespace
) -> dict:
    """One Poisson run per rate on the same stack, lowest rate first."""
    per_rate = {}
    for i, rate in enumerate(rates):
        # NOTE: other prompts at every rate, so no request reuses another's KV (prefix cache).
        prompts = random_prompts(args.num_requests, args.prompt_tokens, vocab_size, args.seed + i)
        offsets = poisson_offsets(rate, args.num_requests, args.seed + i)
        requests = [generate_request(p, args.max_new_tokens) for p in prompts]
        runs = run_streams(address, requests, offsets)
        per_rate[str(rate)] = {
            "rate_per_s": rate,
            "offered_span_s": offsets[-1],
            **latency_summary(runs),
        }
    return per_rate


def isolated_prompts(vocab_size: int, args: argparse.Namespace) -> list[list[int]]:
    """Prompts of ``--isolated-prompt-tokens`` for the one-request-at-a-time TTFT (first one warms
    up); distinct, so no prefix is reused."""
    return random_prompts(
        args.isolated_repeats + 1, args.isolated_prompt_tokens, vocab_size, args.seed + 500
    )


def run_zerolayer_isolated(address: str, vocab_size: int, args: argparse.Namespace) -> float:
    """Median TTFT (s) of single long-prompt requests on an idle stack, through all layers."""
    stub = stub_for(address)
    prompts = isolated_prompts(vocab_size, args)
    stream_token_times(stub, generate_request(prompts[0], 1))
    return median([stream_token_times(stub, generate_request(p, 1)).ttft_s for p in prompts[1:]])


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    baseline = baseline_for("latency")
    rates = sorted(float(r) for r in args.rates.split(",") if r)
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    config = stack_config(args, model_dir)
    with Stack(config):
        warm_up(config.listen, vocab_size)
        isolated_ttft_s = run_zerolayer_isolated(config.listen, vocab_size, args)
        zerolayer = run_zerolayer(config.listen, rates, vocab_size, args)
    within = [r for r in rates if zerolayer[str(r)]["ttft_p99_s"] < args.ttft_slo_s]
    results = {
        "model": str(model_dir),
        "workload": {
            "rates_per_s": rates,
            "num_requests_per_rate": args.num_requests,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "arrivals": "Poisson (exponential gaps, seeded random.Random)",
        },
        "torch_threads": {"zerolayer_scheduler": zerolayer_threads(args)},
        "zerolayer_per_rate": zerolayer,
        "isolated_ttft": {
            "prompt_tokens": args.isolated_prompt_tokens,
            "repeats": args.isolated_repeats,
            "zerolayer_s": isolated_ttft_s,
        },
        "ttft_slo_s": args.ttft_slo_s,
        "highest_rate_within_ttft_slo_per_s": max(within) if within else None,
        "note": f"p99 of {args.num_requests} requests per rate is close to their maximum",
    }
    comparison = baseline.compare(args, model_dir, vocab_size, rates, results) if baseline else None
    panels = {
        "TTFT": {
            "zerolayer p50": (rates, [zerolayer[str(r)]["ttft_p50_s"] for r in rates]),
            "zerolayer p99": (rates, [zerolayer[str(r)]["ttft_p99_s"] for r in rates]),
        },
        "ITL": {
            "zerolayer p50": (rates, [zerolayer[str(r)]["itl_p50_s"] for r in rates]),
            "zerolayer p99": (rates, [zerolayer[str(r)]["itl_p99_s"] for r in rates]),
        },
    }
    for panel, series in (comparison.plot if comparison else {}).items():
        panels[panel].update(series)
    plot_line_panels(
        args.out / "latency.png",
        f"Latency under Poisson arrivals ({args.prompt_tokens}-token prompts, "
        f"{args.max_new_tokens} new tokens)",
        "arrival rate (requests/s)",
        panels,
        {"TTFT": "seconds", "ITL": "seconds"},
    )
    return write_results(args, "latency", compared(results, comparison))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument(
        "--rates",
        type=comma_separated(positive),
        default="1,2,4",
        help="comma-separated arrival rates in requests/s (default %(default)s)",
    )
    p.add_argument("--num-requests", type=at_least(1), default=40, help="requests per rate")
    p.add_argument("--prompt-tokens", type=at_least(1), default=128)
    p.add_argument("--max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--ttft-slo-s", type=positive, default=1.0, help="p99 TTFT bound (s)")
    p.add_argument(
        "--isolated-repeats",
        type=at_least(1),
        default=3,
        help="single long-prompt requests timed on the idle stack (median)",
    )
    p.add_argument(
        "--isolated-prompt-tokens",
        type=at_least(1),
        default=512,
        help="prompt length of the one-request-at-a-time TTFT comparison",
    )
    add_threads_argument(p)
