"""The baseline of ``zerolayer bench coldstart``: a fresh Python process running transformers'
``from_pretrained`` and one ``generate`` token, timed from its start to that token."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from zerolayer.bench.checkout import Comparison
from zerolayer.bench.common import median
from zerolayer.bench.scenario import measured_threads

SYSTEM = "transformers"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS = ("transformers",)
SMOKE: dict = {}

HF_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, transformers
t1 = time.perf_counter()
torch.set_num_threads(int(sys.argv[2]))
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="auto")
model.generation_config.eos_token_id = None
t2 = time.perf_counter()
ids = torch.tensor([json.loads(sys.argv[3])])
with torch.inference_mode():
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
t3 = time.perf_counter()
print(json.dumps({"imports_s": t1 - t0, "from_pretrained_s": t2 - t1, "generate_s": t3 - t2}))
"""
"""A fresh Python process: imports, ``from_pretrained``, one ``generate`` token; prints phases."""


def hf_process_first_token(model_dir: Path, prompt: Sequence[int], num_threads: int) -> dict:
    """Starts :data:`HF_PROCESS` and times it from start to its first token (when it reports).

    Raises:
        subprocess.CalledProcessError: the process failed.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", HF_PROCESS, str(model_dir), str(num_threads), json.dumps(prompt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    total = time.perf_counter() - start
    if proc.wait() != 0 or not line:
        raise subprocess.CalledProcessError(proc.returncode, "transformers cold start")
    return {"to_first_token_s": total, **json.loads(line)}


def compare(
    args: argparse.Namespace, model_dir: Path, prompt: list[int], zerolayer_up_s: float
) -> Comparison:
    """transformers' fresh process to its first token (median of ``--repeats``) against
    ``zerolayer up``'s (``zerolayer_up_s``)."""
    threads = measured_threads(args)
    runs = [hf_process_first_token(model_dir, prompt, threads) for _ in range(args.repeats)]
    hf = {key: median([r[key] for r in runs]) for key in runs[0]}
    up_vs_hf = zerolayer_up_s / hf["to_first_token_s"]
    return Comparison(
        {
            "torch_threads": {"hf_process": threads},
            "hf_process_to_first_token": hf,
            "up_vs_hf_process": up_vs_hf,
            "targets": {"up_vs_hf_process": "<= 0.75"},
            "targets_met": {"up_vs_hf_process": up_vs_hf <= 0.75},
        },
        {"HF process": hf["to_first_token_s"]},
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags of its own: it repeats as often as the scenario (``--repeats``)."""
