"""The baseline of ``zerolayer bench roofline``: transformers' batch-1 decode on the same
prompts in this process."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from benchmarks.hf.generate import hf_token_times, load_hf
from zerolayer.bench.checkout import Comparison
from zerolayer.bench.common import median
from zerolayer.bench.roofline import batch1_prompts
from zerolayer.bench.scenario import measured_threads
from zerolayer.bench.streams import decode_tok_s

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE: dict = {}


def run_hf(model_dir: Path, vocab_size: int, args: argparse.Namespace) -> float:
    """transformers' batch-1 decode rate on the scenario's prompts (median of repeats)."""
    model = load_hf(model_dir)
    singles = batch1_prompts(vocab_size, args)
    hf_token_times(model, singles[0][:8], 2)  # warm-up
    rates = [decode_tok_s([hf_token_times(model, p, args.max_new_tokens)]) for p in singles]
    del model
    gc.collect()
    return median(rates)


def compare(
    args: argparse.Namespace, model_dir: Path, vocab_size: int, zerolayer: dict
) -> Comparison:
    """transformers' batch-1 decode tok/s against zerolayer's (``zerolayer``: the scenario's
    ``zerolayer`` figures)."""
    hf = run_hf(model_dir, vocab_size, args)
    ratio = zerolayer["batch1_decode_tok_s"] / hf
    return Comparison(
        {
            "torch_threads": {"hf": measured_threads(args)},
            "hf_batch1_decode_tok_s": hf,
            "batch1_vs_hf": ratio,
            "targets": {"batch1_vs_hf": ">= 1.3"},
            "targets_met": {"batch1_vs_hf": ratio >= 1.3},
        },
        {"HF": hf},
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags of its own: it runs the scenario's prompts."""
