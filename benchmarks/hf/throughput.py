"""The baseline of ``zerolayer bench throughput``: the same prompts through transformers in this
process, one ``generate`` per request (sequential) and left-padded static batches."""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from benchmarks.hf.generate import hf_generate_batch, hf_token_times, load_hf
from zerolayer.bench.checkout import Comparison
from zerolayer.bench.scenario import measured_threads, set_torch_threads
from zerolayer.cli.arg_types import at_least

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE = {"hf_sequential_requests": 1, "hf_batch_size": 0}
"""Overrides of ``--smoke``."""


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


def compare(
    args: argparse.Namespace, model_dir: Path, prompts: list[list[int]], zerolayer: dict
) -> Comparison:
    """transformers on ``prompts``, and zerolayer's output tok/s (``zerolayer``) against it."""
    threads = measured_threads(args)
    set_torch_threads(threads)
    hf = run_hf(model_dir, prompts, args)
    zl = zerolayer["output_tok_s"]
    vs_batch = zl / hf["hf_padded_batch"]["output_tok_s"]
    vs_sequential = zl / hf["hf_sequential"]["output_tok_s"]
    return Comparison(
        {
            "torch_threads": {"hf_transformers": threads},
            **hf,
            "ratio_vs_hf_padded_batch": vs_batch,
            "ratio_vs_hf_sequential": vs_sequential,
            "targets": {"vs_hf_padded_batch": ">= 1.5", "vs_hf_sequential": ">= 5"},
            "targets_met": {
                "vs_hf_padded_batch": vs_batch >= 1.5,
                "vs_hf_sequential": vs_sequential >= 5,
            },
        },
        {
            "HF padded batch": hf["hf_padded_batch"]["output_tok_s"],
            "HF sequential": hf["hf_sequential"]["output_tok_s"],
        },
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the baseline."""
    p.add_argument(
        "--hf-sequential-requests",
        type=at_least(1),
        default=4,
        help="requests the sequential baseline times (its tok/s is extrapolated)",
    )
    p.add_argument(
        "--hf-batch-size",
        type=at_least(0),
        default=0,
        help="static batch of the baseline; 0: all at once",
    )
