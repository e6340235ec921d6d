"""The baseline of ``zerolayer bench chat``: transformers renders the same messages with
``apply_chat_template`` and runs ``generate`` in this process."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from zerolayer.bench.chat import TurnTiming, Workload, conversation, summarize, turn_messages
from zerolayer.bench.checkout import Comparison

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE: dict = {}


def run_hf(model_dir: Path, w: Workload) -> list[list[TurnTiming]]:
    """Timings of transformers rendering with ``apply_chat_template`` and running ``generate``
    (one new token for the TTFT, then the whole answer)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()

    def prompt_ids(messages: list[dict[str, str]]) -> torch.Tensor:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt"
        )
        return ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids

    runs = []
    with torch.inference_mode():
        for c in range(w.conversations):
            messages = conversation(w, seed=c)
            turns = []
            for t in range(w.num_turns):
                start = time.perf_counter()
                ids = prompt_ids(turn_messages(messages, t))
                model.generate(ids, max_new_tokens=1, do_sample=False)
                ttft = time.perf_counter() - start
                start = time.perf_counter()
                ids = prompt_ids(turn_messages(messages, t))
                model.generate(
                    ids,
                    max_new_tokens=w.answer_tokens,
                    min_new_tokens=w.answer_tokens,
                    do_sample=False,
                )
                turns.append(TurnTiming(ttft, time.perf_counter() - start, ids.shape[-1]))
            runs.append(turns)
    return runs


def compare(
    args: argparse.Namespace, model_dir: Path, w: Workload, zerolayer: list[list[TurnTiming]]
) -> Comparison:
    """transformers on the same conversations; whether both rendered every prompt to the same
    number of tokens, and zerolayer's speed (``zerolayer``: its timings) against it."""
    hf_runs = run_hf(model_dir, w)
    zl, hf = summarize(zerolayer, w), summarize(hf_runs, w)
    zl_lengths = [t.prompt_tokens for run in zerolayer for t in run]
    hf_lengths = [t.prompt_tokens for run in hf_runs for t in run]
    turns = list(range(1, w.num_turns + 1))
    return Comparison(
        {
            "systems": {"hf_transformers": hf},
            "same_prompt_lengths": zl_lengths == hf_lengths,
            "output_tok_s_vs_hf": zl["output_tokens_per_s"] / hf["output_tokens_per_s"],
            "last_turn_ttft_vs_hf": zl["ttft_s_per_turn"][-1] / hf["ttft_s_per_turn"][-1],
        },
        {"hf_transformers": (turns, hf["ttft_s_per_turn"])},
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags of its own: it runs the scenario's conversations."""
