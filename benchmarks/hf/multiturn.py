"""The baseline of ``zerolayer bench multiturn``: transformers re-prefilling the whole history
each turn, in this process, on the same conversations."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from zerolayer.bench.checkout import Comparison
from zerolayer.bench.multiturn import Workload, conversation_messages, per_turn_medians

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE: dict = {}


def run_hf(model_dir: Path, w: Workload, vocab_size: int) -> list[list[float]]:
    """TTFT (s) per turn of transformers re-prefilling the history (generate, 1 new token)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    ttfts = []
    with torch.inference_mode():
        for r in range(w.repeats):
            history: list[int] = []
            turn_ttfts = []
            for message in conversation_messages(w, vocab_size, seed=r):
                history += message
                ids = torch.tensor([history])
                start = time.perf_counter()
                model.generate(ids, max_new_tokens=1, do_sample=False)
                turn_ttfts.append(time.perf_counter() - start)
                out = model.generate(
                    ids,
                    max_new_tokens=w.answer_tokens,
                    do_sample=False,
                    min_new_tokens=w.answer_tokens,
                )
                history += out[0, len(history) :].tolist()
            ttfts.append(turn_ttfts)
    return ttfts


def compare(
    args: argparse.Namespace, model_dir: Path, w: Workload, vocab_size: int, zerolayer: list[float]
) -> Comparison:
    """transformers' TTFT per turn, and zerolayer's last turn (``zerolayer``: TTFT per turn with
    prefix caching) against it."""
    hf = per_turn_medians(run_hf(model_dir, w, vocab_size))
    turns = list(range(1, w.num_turns + 1))
    return Comparison(
        {
            "ttft_s_per_turn": {"hf_transformers": hf},
            "turn_last_over_turn_first": {"hf_transformers": hf[-1] / hf[0]},
            "last_turn_ttft_vs_hf": zerolayer[-1] / hf[-1],
        },
        {"hf_transformers": (turns, hf)},
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags of its own: it runs the scenario's conversations."""
