"""Micro-benchmark of the GGUF kernels (csrc/gguf_*.cpp): GB/s of weights read per decode step,
per type and instruction set, and the prefill choice between the native kernel and dequantize +
torch's matmul.

Decode: the matrices of every layer of the ``small`` preset (12 layers of q, k, v, o [768, 768 /
256], gate, up [2048, 768], down [768, 2048]; 85M weights, more than the caches hold) in the
calls a decode step makes (q, k and v in one call, gate and up in one, then o and down), M rows
of x (bfloat16), each call's bytes of weights over its time; the bfloat16 GEMV
(csrc/skinny_linear.cpp) and the int8 one (csrc/int8_linear.cpp) beside them. The instruction
sets and types alternate within each round; the best and the median of the rounds are printed.

Prefill: one [2048, 768] matrix against M rows of x, the native kernel (tiles of 16 weight rows
against every group of 4 rows of x) against the chunked path (a block of rows dequantized, then
torch's matmul), ms per call.

Fused decode step (``--fused``): one token at position 127 through the whole ``small`` preset
(the fused native step, then the LM head), ms per step, the schemes alternating: its bfloat16
weights, and random blocks of Q8_0 and of Q4_K_M's mix (Q4_K, with Q6_K for v, down and the LM
head; the embedding Q4_K).

Run: ``python -m benchmarks.kernels.gguf [--threads N] [--rounds R] [--types Q4_K Q8_0 ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from zerolayer.bench.inprocess import LocalModel
from zerolayer.bench.logit_agreement import BLOCK_SIZE, span_metadata
from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model
from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES, byte_shape
from zerolayer.checkpoints.int8_format import quantize_weight
from zerolayer.scheduler.model.gguf.linear import quant_linear_chunked
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel

HIDDEN, INTERMEDIATE, KV, LAYERS = 768, 2048, 256, 12
ISAS = ("avx512vnni", "avx2", "portable")
DEFAULT_TYPES = ("Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0")


def cpu_description() -> str:
    """The CPU's model name and the vector extensions the kernels use (/proc/cpuinfo)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")),
        [],
    )
    wanted = (
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
    )
    return f"{model} ({' '.join(f for f in wanted if f in flags)})"


def random_blocks(name: str, n: int, k: int, gen: torch.Generator) -> QuantWeight:
    """Random blocks of ``name`` with small finite float16 scales (the speed does not depend on
    the values)."""
    qtype = SERVED_TYPES[name]
    data = torch.randint(0, 256, byte_shape(name, (n, k)), generator=gen, dtype=torch.uint8)
    blocks = data.view(-1, qtype.type_size)
    scale = torch.full((blocks.shape[0], 1), 0.01, dtype=torch.float16).view(torch.uint8)
    for offset in {
        "Q6_K": (208,),
        "Q4_1": (0, 2),
        "Q5_1": (0, 2),
        "Q4_K": (0, 2),
        "Q5_K": (0, 2),
    }.get(name, (0,)):
        blocks[:, offset : offset + 2] = scale
    return QuantWeight(data, qtype, (n, k))


def layer_shapes() -> list[list[tuple[int, int]]]:
    """One layer's calls: [q, k, v], [o], [gate, up], [down] as (N, K)."""
    return [
        [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN)],
        [(HIDDEN, HIDDEN)],
        [(INTERMEDIATE, HIDDEN)] * 2,
        [(HIDDEN, INTERMEDIATE)],
    ]


def decode_step(
    kind: str, isa: str | None, m: int, kernels: KernelLoader, gen: torch.Generator
) -> tuple[Callable[[], None], int]:
    """A decode step's projections over all layers, and their bytes of weights."""
    module = kernels.load()
    assert module is not None
    calls: list[Callable[[], object]] = []
    total = 0
    for _ in range(LAYERS):
        for shapes in layer_shapes():
            k = shapes[0][1]
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
            if kind == "bf16":
                ws = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for n, _ in shapes]
                total += sum(w.numel() * 2 for w in ws)
                calls.append(lambda x=x, ws=ws: module.skinny_linear_multi(x, ws))
            elif kind == "int8":
                ws8 = [quantize_weight(torch.randn(n, k, generator=gen), 32) for n, _ in shapes]
                total += sum(q.numel() + s.numel() * 4 for q, s in ws8)
                calls.append(lambda x=x, ws8=ws8: module.int8_linear_multi(x, ws8))
            else:
                wq = [random_blocks(kind, n, k, gen) for n, _ in shapes]
                total += sum(w.data.numel() for w in wq)
                if len(wq) == 1:
                    calls.append(lambda x=x, w=wq[0]: module.gguf_linear(x, w, isa=isa))
                elif isa is None:
                    calls.append(lambda x=x, wq=wq: module.gguf_linear_multi(x, wq))
                else:  # the named ISA one weight at a time (multi takes the best ISA)
                    calls.append(lambda x=x, wq=wq: [module.gguf_linear(x, w, isa=isa) for w in wq])
    return (lambda: [c() for c in calls]), total


def timed(f: Callable[[], object], repeats: int) -> float:
    f()
    start = time.perf_counter()
    for _ in range(repeats):
        f()
    return (time.perf_counter() - start) / repeats


def decode_table(args: argparse.Namespace, kernels: KernelLoader) -> None:
    gen = torch.Generator().manual_seed(0)
    module = kernels.load()
    assert module is not None
    cases: list[tuple[str, str | None, int]] = []
    for m in args.rows:
        cases += [("bf16", None, m), ("int8", None, m)]
        for name in args.types:
            cases += [(name, None, m)] + [(name, isa, m) for isa in args.isas]
    steps = {case: decode_step(*case, kernels, gen) for case in cases}
    rates: dict[tuple[str, str | None, int], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, (step, nbytes) in steps.items():
            rates[case].append(nbytes / timed(step, args.repeats) / 1e9)
    print(
        f"decode, all 12 layers of the small preset, GB/s of weights (best, median of "
        f"{args.rounds} rounds), {torch.get_num_threads()} threads, best ISA: "
        f"{module.gguf_isa}"
    )
    print("| weights | path | M | best GB/s | median GB/s | ms per step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, isa, m), values in rates.items():
        path = {"bf16": "skinny_linear", "int8": "int8_linear"}.get(name, isa or "multi (best)")
        ms = steps[(name, isa, m)][1] / statistics.median(values) / 1e6
        print(
            f"| {name} | {path} | {m} | {max(values):.1f} | {statistics.median(values):.1f} "
            f"| {ms:.2f} |"
        )


def prefill_table(args: argparse.Namespace, kernels: KernelLoader) -> None:
    gen = torch.Generator().manual_seed(1)
    module = kernels.load()
    assert module is not None
    print(
        f"\nprefill, [{INTERMEDIATE}, {HIDDEN}] against M rows of x, ms per call (best of "
        f"{args.rounds} rounds), {torch.get_num_threads()} threads"
    )
    print("| weights | x | M | native | dequantize + matmul |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.types:
        w = random_blocks(name, INTERMEDIATE, HIDDEN, gen)
        for dtype in (torch.bfloat16, torch.float32):
            for m in args.prefill_rows:
                x = torch.randn(m, HIDDEN, generator=gen).to(dtype)
                native, chunked = [], []
                for _ in range(args.rounds):
                    native.append(
                        timed(
                            lambda x=x, w=w: module.gguf_linear(x, w, isa=args.prefill_isa),
                            args.repeats,
                        )
                    )
                    chunked.append(
                        timed(
                            lambda x=x, w=w: quant_linear_chunked(x, w, module.gguf_dequantize),
                            args.repeats,
                        )
                    )
                print(
                    f"| {name} | {str(dtype)[6:]} | {m} | "
                    f"{statistics.median(native) * 1e3:.2f} | "
                    f"{statistics.median(chunked) * 1e3:.2f} |"
                )


def scheme_type(name: str, scheme: str) -> str | None:
    """The GGUF type of tensor ``name`` in a file of ``scheme`` (None: kept as it is)."""
    if scheme == "BF16" or not name.endswith(".weight") or "norm" in name:
        return None
    if scheme == "Q8_0":
        return "Q8_0"
    return "Q6_K" if any(part in name for part in ("v_proj", "down_proj", "lm_head")) else "Q4_K"


def fused_step(local: LocalModel, scheme: str, kernels: KernelLoader) -> Callable[[], object]:
    """One batch-1 decode step (fused when it applies) and its logits, as a callable."""
    gen = torch.Generator().manual_seed(2)
    weights, quant_types = dict(local.weights), {}
    for name, tensor in local.weights.items():
        qtype = scheme_type(name, scheme)
        if qtype is not None:
            weights[name] = random_blocks(qtype, *tensor.shape, gen).data
            quant_types[name] = qtype
    model = LlamaModel(local.config, weights, quant_types)
    cfg, context = local.config, 127
    num_blocks = -(-(context + 1) // BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype),) * 2 for _ in model.layers]
    meta = span_metadata(context, context + 1, torch.arange(num_blocks), BLOCK_SIZE)
    ids, positions = torch.tensor([3]), torch.tensor([context])
    return lambda: model.compute_logits(
        model.forward(ids, positions, caches, meta, kernels), kernels
    )


def fused_table(args: argparse.Namespace, kernels: KernelLoader, tmp: Path) -> None:
    local = LocalModel.load(write_dummy_model(tmp / "small", PRESETS["small"], seed=0))
    steps = {s: fused_step(local, s, kernels) for s in ("BF16", "Q8_0", "Q4_K_M")}
    times: dict[str, list[float]] = {s: [] for s in steps}
    for _ in range(args.rounds):
        for scheme, step in steps.items():
            times[scheme].append(timed(step, args.repeats))
    print(
        f"\nfused decode step of the small preset (batch 1, position 127, with the LM head), "
        f"ms (best, median of {args.rounds} rounds), {torch.get_num_threads()} threads"
    )
    print("| weights | best ms | median ms | tok/s at best |")
    print("| --- | --- | --- | --- |")
    for scheme, values in times.items():
        print(
            f"| {scheme} | {min(values) * 1e3:.2f} | {statistics.median(values) * 1e3:.2f} | "
            f"{1 / min(values):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES))
    parser.add_argument("--isas", nargs="+", default=["avx512vnni", "avx2"])
    parser.add_argument("--prefill-rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 512])
    parser.add_argument(
        "--prefill-isa",
        default=None,
        help="the native kernels' instruction set in the prefill table (avx2: "
        "with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 for torch's)",
    )
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--no-decode", action="store_true")
    parser.add_argument("--fused", action="store_true", help="also time the fused decode step")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kernels = KernelLoader()
    if kernels.load() is None:
        raise SystemExit(f"native kernels unavailable: {kernels.unavailable_reason}")
    print(f"CPU: {cpu_description()}")
    if not args.no_decode:
        decode_table(args, kernels)
    if not args.no_prefill:
        prefill_table(args, kernels)
    if args.fused:
        with tempfile.TemporaryDirectory() as tmp:
            fused_table(args, kernels, Path(tmp))


if __name__ == "__main__":
    main()
