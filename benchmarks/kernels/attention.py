"""Micro-benchmark: native paged attention (csrc/) vs the pure-torch reference, per call.

Shapes are the ``small`` preset's attention (12 q heads, 4 kv heads, head_dim 64, bfloat16) over a
paged cache with 16-token blocks and shuffled block tables: decode batches of 1 and 16 sequences
at contexts 256 and 1024, and one fresh 512-token prefill. K/V are already in the cache, so only
attention is timed. Run: ``python -m benchmarks.kernels.attention [--threads N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerolayer.common.generation import EngineRequest, SamplingParams
from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.model.attention import AttentionMetadata, paged_attention_reference
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.model_runner import build_metadata

NUM_Q_HEADS = 12
NUM_KV_HEADS = 4
HEAD_DIM = 64
BLOCK_SIZE = 16
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Case:
    """One step's shape: (num_cached_tokens, num_new_tokens) per sequence."""

    name: str
    sequences: tuple[tuple[int, int], ...]


CASES = (
    Case("decode b=1 ctx=256", ((255, 1),)),
    Case("decode b=1 ctx=1024", ((1023, 1),)),
    Case("decode b=16 ctx=256", ((255, 1),) * 16),
    Case("decode b=16 ctx=1024", ((1023, 1),) * 16),
    Case("prefill 512", ((0, 512),)),
)


def make_step(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A random cache [num_blocks, 16, 4, 64] x2, queries [T, 12, 64] and the step's metadata."""
    g = torch.Generator().manual_seed(seed)
    lengths = [cached + new for cached, new in case.sequences]
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in lengths) + 8
    free = torch.randperm(num_blocks, generator=g).tolist()
    scheduled = []
    for i, (cached, new) in enumerate(case.sequences):
        used = -(-(cached + new) // BLOCK_SIZE)
        block_ids, free = free[:used], free[used:]
        request = Request(
            EngineRequest(str(i), tuple([3] * (cached + new)), 1, SamplingParams()), 0
        )
        request.block_ids = block_ids
        scheduled.append(ScheduledRequest(request, cached, new, samples=True))
    _, _, meta, _ = build_metadata(SchedulerOutput(scheduled), BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    cache = torch.randn(2, *shape, generator=g).to(DTYPE)
    num_tokens = sum(new for _, new in case.sequences)
    q = torch.randn(num_tokens, NUM_Q_HEADS, HEAD_DIM, generator=g).to(DTYPE)
    return q, cache, meta


def time_ms(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    """Median wall time of one call in milliseconds, after warm-up calls."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def bench_case(loader: KernelLoader, case: Case, repeats: int) -> tuple[float, float]:
    """(reference ms, native ms) per call for one step shape."""
    q, cache, meta = make_step(case, seed=0)
    k_cache, v_cache = cache[0], cache[1]
    scale = HEAD_DIM**-0.5

    def reference() -> torch.Tensor:
        return paged_attention_reference(q, k_cache, v_cache, meta, scale)

    def native() -> torch.Tensor:
        return loader.paged_attention_native(
            q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, scale
        )

    torch.testing.assert_close(native().float(), reference().float(), atol=2e-2, rtol=2e-2)
    return time_ms(reference, repeats), time_ms(native, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per case")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loader = KernelLoader()
    if not loader.native_available():
        raise SystemExit(f"native kernel unavailable: {loader.unavailable_reason}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {DTYPE}")
    print(f"{'case':<22} {'reference ms':>12} {'native ms':>10} {'speed-up':>9}")
    with torch.inference_mode():
        for case in CASES:
            reference, native = bench_case(loader, case, args.repeats)
            print(f"{case.name:<22} {reference:>12.3f} {native:>10.3f} {reference / native:>8.1f}x")


if __name__ == "__main__":
    main()
