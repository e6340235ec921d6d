"""The baseline of ``zerolayer bench latency``: transformers' batch-1 ``generate`` of prompts of
the same length in this process, one request, no queueing (what a single user gets)."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from benchmarks.hf.generate import hf_token_times, load_hf
from zerolayer.bench.checkout import Comparison
from zerolayer.bench.common import median, percentile
from zerolayer.bench.latency import isolated_prompts
from zerolayer.bench.scenario import measured_threads, set_torch_threads
from zerolayer.bench.streams import pooled_itl_s, random_prompts
from zerolayer.cli.arg_types import at_least

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE = {"hf_repeats": 1}
"""Overrides of ``--smoke``."""


def run_hf(model_dir: Path, vocab_size: int, args: argparse.Namespace) -> dict:
    """Batch-1 TTFT and ITL of transformers on prompts of the same length (medians of repeats),
    and the TTFT of the isolated long prompts."""
    model = load_hf(model_dir)
    prompts = random_prompts(args.hf_repeats + 1, args.prompt_tokens, vocab_size, args.seed + 99)
    hf_token_times(model, prompts[0], 2)  # warm-up
    runs = [hf_token_times(model, p, args.max_new_tokens) for p in prompts[1:]]
    long_prompts = isolated_prompts(vocab_size, args)
    hf_token_times(model, long_prompts[0], 1)
    isolated = median([hf_token_times(model, p, 1).ttft_s for p in long_prompts[1:]])
    del model
    gc.collect()
    itls = pooled_itl_s(runs)
    return {
        "repeats": len(runs),
        "ttft_s": median([r.ttft_s for r in runs]),
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
        "isolated_ttft_s": isolated,
    }


def compare(
    args: argparse.Namespace, model_dir: Path, vocab_size: int, rates: list[float], zerolayer: dict
) -> Comparison:
    """transformers' batch-1 figures against zerolayer's at the lowest rate and its isolated
    TTFT (``zerolayer``: the scenario's ``zerolayer_per_rate`` and ``isolated_ttft``)."""
    threads = measured_threads(args)
    set_torch_threads(threads)
    hf = run_hf(model_dir, vocab_size, args)
    lowest = zerolayer["zerolayer_per_rate"][str(rates[0])]
    isolated_s = zerolayer["isolated_ttft"]["zerolayer_s"]
    flat = [hf["ttft_s"]] * len(rates), [hf["itl_p50_s"]] * len(rates)
    return Comparison(
        {
            "torch_threads": {"hf_transformers": threads},
            "hf_batch1": hf,
            "isolated_ttft": {
                **zerolayer["isolated_ttft"],
                "hf_in_process_s": hf["isolated_ttft_s"],
                "zerolayer_vs_hf": isolated_s / hf["isolated_ttft_s"],
                "target": "<= 1.15 (one request at a time, idle stack, through all four layers)",
            },
            "lowest_rate_ttft_p50_vs_hf": lowest["ttft_p50_s"] / hf["ttft_s"],
            "lowest_rate_itl_p50_vs_hf": lowest["itl_p50_s"] / hf["itl_p50_s"],
        },
        {"TTFT": {"HF batch-1": (rates, flat[0])}, "ITL": {"HF batch-1 p50": (rates, flat[1])}},
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the baseline."""
    p.add_argument("--hf-repeats", type=at_least(1), default=3, help="baseline requests (medians)")
