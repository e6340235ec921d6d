"""Roofline: decode tok/s against what this machine's memory bandwidth and matmul rate allow.

Batch-1 decode reads every weight once per token, so its bound is (bytes/s of a large bf16 GEMV) /
(weight bytes read per token). Large-batch decode reuses each weight for the whole batch, so its
bound is (FLOP/s of a large bf16 matmul) / (2 * parameters per token). From a checkout,
transformers' batch-1 decode on the same prompts is the baseline (``benchmarks/hf/roofline.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

from zerolayer.bench.checkout import baseline_for, compared
from zerolayer.bench.common import median, write_results
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
from zerolayer.bench.streams import decode_tok_s, generate_request, random_prompts, run_streams
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.cli.arg_types import at_least
from zerolayer.common.settings import MAX_NUM_SEQS
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.stack.launcher import Stack

HELP = "decode tok/s against this machine's memory-bandwidth and matmul bounds"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {
    "prompt_tokens": 16,
    # NOTE: 64, so the batch's steady window (after its last first token, before its first last
    # token) is not empty when a request starts late on a busy machine (CI saw 0.0 with fewer)
    "max_new_tokens": 64,
    "batch_size": 4,
    "repeats": 1,
    "gemv_bytes": 8 << 20,
    "mm_size": 256,
}
"""Overrides of ``--smoke`` (the GEMV then fits in cache: not a bandwidth measurement)."""

FALLBACK_LLC_BYTES = 32 << 20


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache of cpu0 (sysfs), or 32 MiB when it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=FALLBACK_LLC_BYTES)


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first touch of the pages, kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def _gemv_bytes_per_s(dtype_name: str, num_bytes: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    cols = 8192
    rows = max(num_bytes // (cols * dtype.itemsize), 1)
    a = torch.full((rows, cols), 0.5, dtype=dtype)
    x = torch.full((cols,), 0.5, dtype=dtype)
    out = {f"{dtype_name}_mv": a.nbytes / _median_seconds(lambda: torch.mv(a, x), repeats)}
    if dtype == torch.bfloat16:
        linear_s = _median_seconds(lambda: F.linear(x.view(1, -1), a), repeats)
        out[f"{dtype_name}_linear"] = a.nbytes / linear_s
        out[f"{dtype_name}_sum"] = a.nbytes / _median_seconds(a.sum, repeats)
        module = KernelLoader().load()
        if module is not None:
            native_s = _median_seconds(lambda: module.skinny_linear(x.view(1, -1), a), repeats)
            out[f"{dtype_name}_native_gemv"] = a.nbytes / native_s
    return out


def gemv_bandwidth(num_bytes: int, repeats: int) -> dict:
    """Bytes/s of reading a ``num_bytes`` matrix: bf16 ``torch.mv``, bf16 ``F.linear`` of one
    row, bf16 ``sum`` (a plain streaming read), the native bf16 GEMV the model's decode
    projections run (``csrc/skinny_linear.cpp``) and float32 ``torch.mv``. The bound uses the
    fastest, so a faster kernel of ours raises the bound instead of beating it."""
    return {
        **_gemv_bytes_per_s("bfloat16", num_bytes, repeats),
        **_gemv_bytes_per_s("float32", num_bytes, repeats),
    }


def matmul_flops(n: int, repeats: int) -> float:
    """FLOP/s of a bf16 ``torch.mm`` of two n x n matrices (2 n^3 FLOPs)."""
    import torch

    a = torch.full((n, n), 0.5, dtype=torch.bfloat16)
    return 2 * n**3 / _median_seconds(lambda: torch.mm(a, a), repeats)


def weight_traffic(model_dir: Path) -> dict:
    """Weight bytes and parameters one decoded token reads: every tensor once, except the
    embedding table, of which a lookup reads one row (unless the head is tied to it)."""
    manifest = read_checkpoint(model_dir)
    names = {t.name for t in manifest.tensors}
    tied = "lm_head.weight" not in names
    num_bytes = num_params = 0
    for t in manifest.tensors:
        n = math.prod(t.shape)
        if t.name.endswith("embed_tokens.weight") and not tied:
            num_bytes += t.nbytes // t.shape[0]
            num_params += n // t.shape[0]
        else:
            num_bytes += t.nbytes
            num_params += n
    return {"weight_bytes_per_token": num_bytes, "params_per_token": num_params}


def batch1_prompts(vocab_size: int, args: argparse.Namespace) -> list[list[int]]:
    """The prompts of the batch-1 decodes, one per repeat."""
    return random_prompts(args.repeats, args.prompt_tokens, vocab_size, seed=1)


def run_zerolayer(address: str, vocab_size: int, args: argparse.Namespace) -> dict:
    """Batch-1 decode rate (median of repeats) and the decode rate of ``batch_size`` at once."""
    singles = batch1_prompts(vocab_size, args)
    batch1 = [
        decode_tok_s(run_streams(address, [generate_request(p, args.max_new_tokens)], [0.0]))
        for p in singles
    ]
    batch = random_prompts(args.batch_size, args.prompt_tokens, vocab_size, seed=2)
    runs = run_streams(
        address, [generate_request(p, args.max_new_tokens) for p in batch], [0.0] * len(batch)
    )
    return {"batch1_decode_tok_s": median(batch1), "batch_decode_tok_s": decode_tok_s(runs)}


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    threads = measured_threads(args)
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    traffic = weight_traffic(model_dir)
    llc = last_level_cache_bytes()
    gemv_bytes = args.gemv_bytes or max(4 * llc, 256 << 20)
    set_torch_threads(threads)
    bandwidth = gemv_bandwidth(gemv_bytes, args.repeats + 2)
    flops = matmul_flops(args.mm_size, args.repeats + 2)
    best_bf16 = max(v for name, v in bandwidth.items() if name.startswith("bfloat16"))
    bw_bound = best_bf16 / traffic["weight_bytes_per_token"]
    compute_bound = flops / (2 * traffic["params_per_token"])
    config = stack_config(args, model_dir, max_num_seqs=max(MAX_NUM_SEQS.default, args.batch_size))
    with Stack(config):
        warm_up(config.listen, vocab_size)
        zerolayer = run_zerolayer(config.listen, vocab_size, args)
    baseline = baseline_for("roofline")
    comparison = baseline.compare(args, model_dir, vocab_size, zerolayer) if baseline else None
    b1, bn = zerolayer["batch1_decode_tok_s"], zerolayer["batch_decode_tok_s"]
    results = {
        "model": str(model_dir),
        "workload": {
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "decode_tok_s": "tokens arriving while every request decodes, per second",
        },
        "torch_threads": {
            "microbenchmarks": threads,
            "zerolayer_scheduler": zerolayer_threads(args),
        },
        "machine_rates": {
            "last_level_cache_bytes": llc,
            "gemv_matrix_bytes": gemv_bytes,
            "gemv_bytes_per_s": bandwidth,
            "bandwidth_used_for_bound": "max of the bfloat16_* read rates",
            "mm_size": args.mm_size,
            "bf16_mm_flop_per_s": flops,
        },
        **traffic,
        "bandwidth_bound_tok_s": bw_bound,
        "f32_gemv_bandwidth_bound_tok_s": bandwidth["float32_mv"]
        / traffic["weight_bytes_per_token"],
        "compute_bound_tok_s": compute_bound,
        "zerolayer": zerolayer,
        "batch1_vs_bandwidth_bound": b1 / bw_bound,
        "batch_vs_compute_bound": bn / compute_bound,
        "targets": {"batch1_vs_bandwidth_bound": ">= 0.7"},
        "targets_met": {"batch1_vs_bandwidth_bound": b1 / bw_bound >= 0.7},
        "note": "KV-cache reads are not in the bounds (small next to the weights at these "
        "context lengths)",
    }
    plot_bars(
        args.out / "roofline.png",
        "Decode tokens/s against the machine's bounds",
        {
            "batch 1": {
                "bandwidth bound": bw_bound,
                "zerolayer": b1,
                **(comparison.plot if comparison else {}),
            },
            f"batch {args.batch_size}": {"compute bound": compute_bound, "zerolayer": bn},
        },
        {"batch 1": "tokens/s", f"batch {args.batch_size}": "tokens/s"},
    )
    return write_results(args, "roofline", compared(results, comparison))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--prompt-tokens", type=at_least(1), default=128)
    p.add_argument("--max-new-tokens", type=at_least(2), default=128)
    p.add_argument("--batch-size", type=at_least(1), default=64, help="the large-batch decode")
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument(
        "--gemv-bytes",
        type=at_least(0),
        default=0,
        help="GEMV matrix size; 0: max(4 x LLC, 256 MiB)",
    )
    p.add_argument("--mm-size", type=at_least(1), default=2048, help="n of the n x n bf16 matmul")
    add_threads_argument(p)
