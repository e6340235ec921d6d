"""Offline throughput: N requests sent at once, output tokens per second.

zerolayer receives all requests at the same moment over gRPC (unary calls as grpc futures, so the
client is a few sleeping threads); the baselines run the same prompts in this process with
transformers: one ``generate`` per request (sequential) and left-padded static batches.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import grpc

from zerolayer.bench.common import write_results
from zerolayer.bench.hf_baseline import hf_generate_batch, hf_token_times, load_hf
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import (
    add_threads_argument,
    measured_threads,
    model_dir_for,
    set_torch_threads,
    stack_config,
    vocab_size_of,
    warm_up,
    zerolayer_threads,
)
from zerolayer.bench.streams import generate_request, random_prompts
from zerolayer.common.settings import MAX_NUM_SEQS
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2_grpc

SMOKE = {
    "num_requests": 4,
    "prompt_tokens": 16,
    "max_new_tokens": 8,
    "hf_sequential_requests": 1,
    "hf_batch_size": 0,
}
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


def run_hf(model_dir: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Sequential (a timed subset, extrapolated) and padded static batches."""
    model = load_hf(model_dir)
    hf_token_times(model, prompts[0][:8], 2)  # warm-up of both paths
    hf_generate_batch(model, [p[:8] for p in prompts[:2]], 2)
    num_sequential = min(args.hf_sequential_requests, len(prompts))
    start = time.perf_counter()
    for prompt in prompts[:num_sequential]:
        hf_token_times(model, prompt, args.max_new_tokens)
    sequential_s = time.perf_counter() - start
    batch_size = args.hf_batch_size or len(prompts)
    batched_s = sum(
        hf_generate_batch(model, prompts[i : i + batch_size], args.max_new_tokens)
        for i in range(0, len(prompts), batch_size)
    )
    del model
    gc.collect()
    total = len(prompts) * args.max_new_tokens
    return {
        "hf_sequential": {
            "requests_timed": num_sequential,
            "seconds_timed": sequential_s,
            "seconds_extrapolated_to_all": sequential_s * len(prompts) / num_sequential,
            "output_tok_s": num_sequential * args.max_new_tokens / sequential_s,
            "note": f"{num_sequential} of {len(prompts)} requests timed one by one; tok/s of "
            "those, all-requests time extrapolated linearly",
        },
        "hf_padded_batch": {
            "batch_size": batch_size,
            "seconds": batched_s,
            "output_tok_s": total / batched_s,
            "note": "left-padded static batches (every prompt has the same length, so no pad "
            "tokens are computed)",
        },
    }


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    threads = measured_threads(args)
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
    set_torch_threads(threads)
    hf = run_hf(model_dir, prompts, args)
    zl = zerolayer["output_tok_s"]
    vs_batch = zl / hf["hf_padded_batch"]["output_tok_s"]
    vs_sequential = zl / hf["hf_sequential"]["output_tok_s"]
    results = {
        "model": str(model_dir),
        "workload": {
            "num_requests": args.num_requests,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": True,
            "greedy": True,
        },
        "torch_threads": {
            "zerolayer_scheduler": zerolayer_threads(args),
            "hf_transformers": threads,
        },
        "zerolayer": {
            **zerolayer,
            "max_num_seqs": config.max_num_seqs,
            "schedulers": config.schedulers,
        },
        **hf,
        "ratio_vs_hf_padded_batch": vs_batch,
        "ratio_vs_hf_sequential": vs_sequential,
        "targets": {"vs_hf_padded_batch": ">= 1.5", "vs_hf_sequential": ">= 5"},
        "targets_met": {
            "vs_hf_padded_batch": vs_batch >= 1.5,
            "vs_hf_sequential": vs_sequential >= 5,
        },
    }
    plot_bars(
        args.out / "throughput.png",
        f"Throughput, {args.num_requests} requests at once "
        f"({args.prompt_tokens} prompt, {args.max_new_tokens} new tokens)",
        {
            "output tokens/s": {
                "zerolayer": zl,
                "HF padded batch": hf["hf_padded_batch"]["output_tok_s"],
                "HF sequential": hf["hf_sequential"]["output_tok_s"],
            }
        },
    )
    write_results(args.out, "throughput", args.command, results)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--hf-sequential-requests",
        type=int,
        default=4,
        help="requests the sequential baseline times (its tok/s is extrapolated)",
    )
    p.add_argument(
        "--hf-batch-size", type=int, default=0, help="static batch of the baseline; 0: all at once"
    )
    p.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="scheduler processes of zerolayer's stack, each with --num-threads torch threads",
    )
    add_threads_argument(p)
