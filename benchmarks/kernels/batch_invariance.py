"""Micro-benchmark: the model forward with and without batch invariance (``--batch-invariant``).

The ``small`` preset (125M Llama shape, bfloat16, random weights) runs one step of the Llama
forward plus the lm_head of the sampling rows, in this process: decode batches of 1, 4, 16 and 64
sequences at context 128, and one fresh 512-token prefill. The two paths alternate call by call
(so load from other processes hits both alike); reported are tokens per second from the median
step time and the invariant path's throughput relative to the default one. Run:
``python -m benchmarks.kernels.batch_invariance [--threads N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.kernels.attention import Case, make_step
from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel

CASES = (
    Case("decode b=1", ((127, 1),)),
    Case("decode b=4", ((127, 1),) * 4),
    Case("decode b=16", ((127, 1),) * 16),
    Case("decode b=64", ((127, 1),) * 64),
    Case("prefill 512", ((0, 512),)),
)


def step_fn(model: LlamaModel, case: Case, kernels: KernelLoader) -> Callable[[], torch.Tensor]:
    """One step of ``case`` (forward of all its tokens, logits of each sequence's last one)."""
    _, cache, meta = make_step(case, seed=0)
    kv_caches = [(cache[0], cache[1])] * model.config.num_hidden_layers
    positions = torch.cat([torch.arange(c, c + n) for c, n in case.sequences])
    input_ids = torch.randint(3, model.config.vocab_size, positions.shape)
    last_rows = meta.query_start_loc[1:] - 1

    def step() -> torch.Tensor:
        hidden = model.forward(input_ids, positions, kv_caches, meta, kernels)
        return model.compute_logits(hidden[last_rows], kernels)

    return step


def time_both(
    default: Callable[[], torch.Tensor], invariant: Callable[[], torch.Tensor], repeats: int
) -> tuple[float, float]:
    """Median seconds per call of each, calls alternating, after two warm-up calls each."""
    for _ in range(2):
        default(), invariant()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((default, samples[0]), (invariant, samples[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(samples[0]), statistics.median(samples[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per case and path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = LlamaModel(*_small_model())
    default, invariant = KernelLoader(), KernelLoader(batch_invariant=True)
    if not invariant.native_available() or not default.native_available():
        raise SystemExit(f"native kernels unavailable: {invariant.unavailable_reason}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, small preset (bf16)")
    print(f"{'case':<14} {'default tok/s':>14} {'invariant tok/s':>16} {'relative':>9}")
    for case in CASES:
        num_tokens = sum(new for _, new in case.sequences)
        a, b = time_both(
            step_fn(model, case, default), step_fn(model, case, invariant), args.repeats
        )
        print(f"{case.name:<14} {num_tokens / a:>14.1f} {num_tokens / b:>16.1f} {a / b:>9.2f}")


def _small_model() -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    local = LocalModel.load(ensure_dummy_model("small"))
    return local.config, local.weights


if __name__ == "__main__":
    main()
