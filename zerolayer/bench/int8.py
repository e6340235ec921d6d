"""Weight-only int8 (``zerolayer quantize``) against the original checkpoint: decode speed and
greedy agreement.

Quantizes the model, serves both checkpoints through the four layers at once and measures batch-1
decode tok/s of each, alternating requests (bf16, int8, bf16, ...) so load from other processes
hits both alike; then, in this process, the teacher-forced argmax agreement and the logit cosine
of the int8 forward against the original one over a few hundred positions.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from zerolayer.bench import scenario
from zerolayer.bench.common import median, write_results
from zerolayer.bench.inprocess import LocalModel
from zerolayer.bench.logit_agreement import BLOCK_SIZE, agreement, chunked_logits, span_metadata
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.streams import decode_tok_s, generate_request, random_prompts, run_streams
from zerolayer.checkpoints.quantize import quantize_checkpoint
from zerolayer.cli.arg_types import at_least
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.stack.launcher import Stack

HELP = "an int8 copy (zerolayer quantize) against the original: decode speed, greedy agreement"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {"max_new_tokens": 16, "repeats": 1, "positions": 16, "steps": 2}
"""Overrides of ``--smoke``."""
SIDES = ("original", "int8")


def quantized_copy(model_dir: Path, out: Path, group_size: int) -> Path:
    """``model_dir`` quantized into ``out/<name>-int8`` (rewritten each run)."""
    int8_dir = out / f"{model_dir.name}-int8"
    shutil.rmtree(int8_dir, ignore_errors=True)
    quantize_checkpoint(model_dir, int8_dir, group_size)
    return int8_dir


def decode_rates(addresses: dict[str, str], vocab_size: int, args: argparse.Namespace) -> dict:
    """Batch-1 decode tok/s of each side, requests alternating; median of the repeats."""
    rates: dict[str, list[float]] = {side: [] for side in addresses}
    for r in range(args.repeats):
        prompt = random_prompts(1, args.prompt_tokens, vocab_size, seed=r)[0]
        for side, address in addresses.items():
            runs = run_streams(address, [generate_request(prompt, args.max_new_tokens)], [0.0])
            rates[side].append(decode_tok_s(runs))
    return {side: {"decode_tok_s": median(v), "samples": v} for side, v in rates.items()}


def decode_step(model_dir: Path, kernels: KernelLoader, context: int) -> Callable[[], object]:
    """One batch-1 decode step of the checkpoint in this process (forward of one token at
    position ``context``, then its logits), as a callable to time."""
    local = LocalModel.load(model_dir)
    model = LlamaModel(local.config, local.weights)
    cfg = local.config
    num_blocks = -(-(context + 1) // BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype),) * 2 for _ in model.layers]
    meta = span_metadata(context, context + 1, torch.arange(num_blocks), BLOCK_SIZE)
    ids, positions = torch.tensor([3]), torch.tensor([context])
    return lambda: model.compute_logits(
        model.forward(ids, positions, caches, meta, kernels), kernels
    )


def step_times(dirs: dict[str, Path], args: argparse.Namespace) -> dict:
    """Seconds per in-process decode step of each side, calls alternating: minimum and median
    (the minimum is the least disturbed by other processes)."""
    kernels = KernelLoader()
    steps = {side: decode_step(d, kernels, context=127) for side, d in dirs.items()}
    samples: dict[str, list[float]] = {side: [] for side in steps}
    for i in range(args.steps + 2):
        for side, step in steps.items():
            start = time.perf_counter()
            step()
            if i >= 2:  # two warm-up calls each
                samples[side].append(time.perf_counter() - start)
    return {
        side: {"min_s": min(v), "median_s": median(v), "decode_tok_s_at_min": 1 / min(v)}
        for side, v in samples.items()
    }


def teacher_forced(dirs: dict[str, Path], vocab_size: int, args: argparse.Namespace) -> dict:
    """Agreement of the int8 logits with the original's over ``--positions`` tokens."""
    tokens = random_prompts(1, args.positions, vocab_size, seed=12_345)[0]
    kernels = KernelLoader()
    logits = {side: chunked_logits(d, tokens, kernels, step_tokens=4) for side, d in dirs.items()}
    return agreement(logits["original"], logits["int8"])


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    threads = scenario.measured_threads(args)
    scenario.set_torch_threads(threads)
    model_dir = scenario.model_dir_for(args)
    vocab_size = scenario.vocab_size_of(model_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = {"original": model_dir, "int8": quantized_copy(model_dir, args.out, args.group_size)}
    configs = {
        "original": scenario.stack_config(args, model_dir),
        "int8": scenario.stack_config(
            args,
            dirs["int8"],
            listen=f"127.0.0.1:{args.port + 1}",
            log_dir=str(args.out / "logs-int8"),
        ),
    }
    with Stack(configs["original"]), Stack(configs["int8"]):
        for config in configs.values():
            scenario.warm_up(config.listen, vocab_size)
        rates = decode_rates({s: c.listen for s, c in configs.items()}, vocab_size, args)
    steps = step_times(dirs, args)
    quality = teacher_forced(dirs, vocab_size, args)
    results = {
        "model": str(model_dir),
        "int8_model": str(dirs["int8"]),
        "workload": {
            "group_size": args.group_size,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "decode_tok_s": "batch 1 through the four layers, after the first token; requests "
            "alternate between the two stacks; median of repeats",
            "in_process_decode_step": "one batch-1 step (forward of a token at position 127 and "
            "its logits) of each checkpoint in this process, calls alternating; minimum and "
            "median of --steps calls",
            "teacher_forced": "the same random token sequence through both forwards in this "
            "process, 4 tokens a step (the decode path); argmax and logit cosine per position",
        },
        "torch_threads": threads,
        "services": rates,
        "int8_vs_original_decode_tok_s": rates["int8"]["decode_tok_s"]
        / rates["original"]["decode_tok_s"],
        "in_process_decode_step": steps,
        "int8_vs_original_in_process_step_speed": steps["original"]["min_s"]
        / steps["int8"]["min_s"],
        "teacher_forced": quality,
    }
    plot_bars(
        args.out / "int8.png",
        "int8 weights vs the original checkpoint",
        {
            "decode tokens/s, batch 1 (services)": {s: rates[s]["decode_tok_s"] for s in SIDES},
            "decode steps/s, batch 1 (in process, best)": {
                s: steps[s]["decode_tok_s_at_min"] for s in SIDES
            },
            "teacher-forced agreement": {
                "argmax": quality["argmax_agreement"],
                "mean logit cosine": quality["mean_logit_cosine"],
            },
        },
    )
    return write_results(args, "int8", results)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument(
        "--group-size", type=at_least(1), default=32, help="weights per scale (default 32)"
    )
    p.add_argument("--prompt-tokens", type=at_least(1), default=32)
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument("--repeats", type=at_least(1), default=5, help="requests per side (median)")
    p.add_argument("--steps", type=at_least(1), default=30, help="timed in-process steps per side")
    p.add_argument(
        "--positions", type=at_least(1), default=256, help="teacher-forced positions (default 256)"
    )
    scenario.add_threads_argument(p)
