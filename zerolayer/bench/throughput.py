"""Offline throughput: N requests sent at once, output tokens per second.

zerolayer receives all requests at the same moment over gRPC (unary calls as grpc futures, so the
client is a few sleeping threads). From a checkout, the baseline runs the same prompts with
transformers (:mod:`zerolayer.bench.checkout`; ``benchmarks/hf/throughput.py``).
"""

from __future__ import annotations

import argparse
import time

import grpc

from zerolayer.bench.checkout import baseline_for, compared
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
from zerolayer.bench.streams import generate_request, random_prompts
from zerolayer.cli.arg_types import at_least
from zerolayer.common.settings import MAX_NUM_SEQS
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2_grpc

HELP = "N requests sent at once: output tokens/s"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {"num_requests": 4, "prompt_tokens": 16, "max_new_tokens": 8}
"""Overrides of ``--smoke``."""


def run_zerolayer(address: str, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """All requests at once; returns wall seconds and output tokens per second."""
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        requests = [generate_request(p, max_new_tokens) for p in prompts]
        start = time.perf_counter()
        futures = [stub.Generate.future(r, timeout=3600) for r in requests]
        responses = [f.result() for f in futures]
        seconds = time.perf_counter() - start
    num_tokens = sum(len(r.token_ids) for r in responses)
    if num_tokens != len(prompts) * max_new_tokens:
        raise RuntimeError(f"zerolayer generated {num_tokens} tokens, expected all of them")
    return {"seconds": seconds, "output_tok_s": num_tokens / seconds}


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    baseline = baseline_for("throughput")
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    prompts = random_prompts(args.num_requests, args.prompt_tokens, vocab_size, seed=0)
    config = stack_config(
        args,
        model_dir,
        max_num_seqs=max(MAX_NUM_SEQS.default, args.num_requests),
        schedulers=args.schedulers,
    )
    with Stack(config):
        warm_up(config.listen, vocab_size)
        zerolayer = run_zerolayer(config.listen, prompts, args.max_new_tokens)
    comparison = baseline.compare(args, model_dir, prompts, zerolayer) if baseline else None
    results = {
        "model": str(model_dir),
        "workload": {
            "num_requests": args.num_requests,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": True,
            "greedy": True,
        },
        "torch_threads": {"zerolayer_scheduler": zerolayer_threads(args)},
        "zerolayer": {
            **zerolayer,
            "max_num_seqs": config.max_num_seqs,
            "schedulers": config.schedulers,
        },
    }
    plot_bars(
        args.out / "throughput.png",
        f"Throughput, {args.num_requests} requests at once "
        f"({args.prompt_tokens} prompt, {args.max_new_tokens} new tokens)",
        {
            "output tokens/s": {
                "zerolayer": zerolayer["output_tok_s"],
                **(comparison.plot if comparison else {}),
            }
        },
    )
    return write_results(args, "throughput", compared(results, comparison))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--num-requests", type=at_least(1), default=64)
    p.add_argument("--prompt-tokens", type=at_least(1), default=256)
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument(
        "--schedulers",
        type=at_least(1),
        default=1,
        help="scheduler processes of zerolayer's stack, each with --num-threads torch threads",
    )
    add_threads_argument(p)
