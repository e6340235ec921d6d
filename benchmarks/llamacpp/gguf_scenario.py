"""gguf: zerolayer serving GGUF files against llama.cpp on the same files (issue 32).

For each file type (``--gguf-types``, default BF16, Q8_0 and Q4_K_M) the checkpoint is written
as GGUF once: BF16 by the bench's exporter, Q8_0 and Q4_K_M by llama.cpp's own quantizer
(:mod:`benchmarks.llamacpp.llama_quantize`). zerolayer serves that very file (``zerolayer up
--model FILE.gguf`` with its defaults, through the four layers) and llama.cpp runs it in this
process (llama-cpp-python), in interleaved rounds: batch-1 decode tok/s, the time to the first
token of a 512-token prompt and the output tok/s of 16 x (256, 64) sent at once. Then, per file:
the mean log-likelihood of a fixed text (zerolayer, llama.cpp, transformers float32 on the
checkpoint the file was made from), the greedy tokens of a set of prompts (zerolayer against
llama.cpp), and the memory of each (zerolayer's four processes; llama.cpp in a child process
doing the same work): resident bytes, their own and mapped.

``--llama-cpp PREFIX`` (``scripts/build_llama_cpp.sh``) makes llama-cpp-python load that build's
library; under ``ZEROLAYER_CPU_ISA=avx2`` a llama.cpp that uses AVX-512 is refused, so an AVX2
figure never compares against an AVX-512 baseline. Every figure is written with the CPU's model
and vector extensions (``machine`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.llamacpp import quality
from benchmarks.llamacpp.scenario import measure_round, summarize
from benchmarks.llamacpp.systems import LlamaCppSystem, ZerolayerSystem
from zerolayer.bench.checkout import CHECKOUT_ROOT
from zerolayer.bench.common import median, write_results
from zerolayer.bench.memory import process_memory, total_memory
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import model_dir_for, set_torch_threads, vocab_size_of, warm_up
from zerolayer.bench.streams import num_cores, random_prompts
from zerolayer.cli.arg_types import at_least
from zerolayer.stack.launcher import Stack, StackConfig

HELP = "zerolayer on GGUF files (BF16, Q8_0, Q4_K_M) against llama.cpp on the same files"
"""The scenario's line in ``zerolayer bench --help``."""
REQUIREMENTS = ("matplotlib", "transformers")
"""llama-cpp-python is optional: without it only zerolayer's side runs (BF16 and Q8_0 files
written by the ``gguf`` package; Q4_K_M needs llama.cpp's quantizer)."""
SMOKE = {
    "rounds": 1,
    "decode_prompt_tokens": 8,
    "decode_tokens": 8,
    "ttft_prompt_tokens": 16,
    "batch_requests": 2,
    "batch_prompt_tokens": 16,
    "batch_max_new_tokens": 4,
    "greedy_prompts": 2,
    "greedy_tokens": 4,
}
"""Overrides of ``--smoke``."""

DECODE_TARGETS = {"bf16": 1.0, "q8_0": 1.2, "q4_k_m": 1.0}
"""Batch-1 decode, zerolayer / llama.cpp on the same file, at least (issue 32)."""
THROUGHPUT_TARGET = 1.5
"""16 x (256, 64) output tok/s, zerolayer / llama.cpp, at least."""
LOGLIK_TOLERANCE = 0.005
"""zerolayer's mean log-likelihood within this fraction of llama.cpp's on the same file."""
MEASUREMENTS = ("decode_tok_s", "ttft_s", "batch_output_tok_s")
LLAMA_FILE_TYPES = ("q8_0", "q4_k_m")
"""Made by llama.cpp's quantizer; the others by the bench's exporter."""


def llama_cpp_available() -> str | None:
    """Why llama.cpp cannot run here (None: it can); imports llama_cpp (after
    :func:`use_llama_cpp` chose its library)."""
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        return f"llama-cpp-python does not load: {exc}"
    info = llama_cpp.llama_print_system_info().decode()
    if os.environ.get("ZEROLAYER_CPU_ISA") == "avx2" and "AVX512 = 1" in info:
        raise SystemExit(
            "zerolayer bench gguf: error: ZEROLAYER_CPU_ISA=avx2, but llama.cpp uses AVX-512 "
            "(its system info: " + info.strip() + "); give an AVX2 build with --llama-cpp "
            "(scripts/build_llama_cpp.sh avx2)"
        )
    return None


def use_llama_cpp(prefix: str | None) -> None:
    """Points llama-cpp-python at ``PREFIX/lib`` (before its first import)."""
    if prefix:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(Path(prefix) / "lib")


def gguf_file(model_dir: Path, cache: Path, file_type: str, llama_reason: str | None) -> Path:
    """The GGUF file of ``file_type`` under ``cache``, made once.

    Raises:
        RuntimeError: a type only llama.cpp's quantizer makes, without llama.cpp.
    """
    from benchmarks.llamacpp.gguf_export import ensure_gguf

    if file_type not in LLAMA_FILE_TYPES:
        return ensure_gguf(model_dir, cache, file_type)
    if llama_reason is None:
        from benchmarks.llamacpp.llama_quantize import ensure_quantized

        return ensure_quantized(model_dir, cache, file_type)
    if file_type == "q8_0":  # the gguf package's Q8_0 (llama.cpp's reference quantization)
        return ensure_gguf(model_dir, cache, file_type)
    raise RuntimeError(f"{file_type} is made by llama.cpp's quantizer: {llama_reason}")


def round_prompts(r: int, vocab_size: int, args: argparse.Namespace) -> dict:
    """The round's prompts, the same for both systems (distinct per round: no cache hit)."""
    seed = 1000 * (r + 1)
    return {
        "decode": random_prompts(1, args.decode_prompt_tokens, vocab_size, seed)[0],
        "ttft": random_prompts(1, args.ttft_prompt_tokens, vocab_size, seed + 1)[0],
        "batch": random_prompts(
            args.batch_requests, args.batch_prompt_tokens, vocab_size, seed + 2
        ),
    }


def longest_sequence(args: argparse.Namespace) -> int:
    """Tokens of the longest sequence any measurement makes."""
    return max(
        args.decode_prompt_tokens + args.decode_tokens,
        args.ttft_prompt_tokens + 1,
        args.batch_prompt_tokens + args.batch_max_new_tokens,
        args.greedy_prompt_tokens + args.greedy_tokens,
        1024,
    )


def open_llama(
    file_type: str, path: Path, num_threads: int, args: argparse.Namespace
) -> LlamaCppSystem:
    """llama.cpp on ``path``: a one-sequence context and a batched one."""
    from benchmarks.llamacpp.engine import LlamaCppConfig, LlamaCppModel

    longest = longest_sequence(args)
    single = LlamaCppModel(path, LlamaCppConfig(num_threads, 1, longest))
    batched = LlamaCppModel(path, LlamaCppConfig(num_threads, args.batch_requests, longest))
    return LlamaCppSystem(f"llama.cpp {file_type.upper()}", single, batched)


LLAMA_MEMORY_CODE = """
import json, os, sys
from pathlib import Path
from benchmarks.llamacpp.engine import LlamaCppConfig, LlamaCppModel
from zerolayer.bench.memory import process_memory
path, threads, prompt_tokens, new_tokens = Path(sys.argv[1]), *map(int, sys.argv[2:5])
model = LlamaCppModel(path, LlamaCppConfig(threads, 1, prompt_tokens + new_tokens))
model.greedy([[3 + i % 200 for i in range(prompt_tokens)]], new_tokens)
print(json.dumps(process_memory(os.getpid(), [path])))
"""
"""A child process: llama.cpp on the file, one prefill and some decode, then its memory."""


def llama_memory(path: Path, num_threads: int, args: argparse.Namespace) -> dict:
    """:func:`process_memory` of a child process that ran llama.cpp on ``path`` (a prefill of
    ``--ttft-prompt-tokens`` and ``--decode-tokens`` of decode)."""
    argv = [sys.executable, "-c", LLAMA_MEMORY_CODE, str(path), str(num_threads)]
    argv += [str(args.ttft_prompt_tokens), str(args.decode_tokens)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=True, cwd=CHECKOUT_ROOT
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def stack_memory(stack: Stack, path: Path) -> dict:
    """:func:`process_memory` of each process of ``stack``, and their totals."""
    per = {name: process_memory(p.pid, [path]) for name, p in stack.processes.items()}
    return {"processes": per, "total": total_memory(per)}


def greedy(address: str, llama: LlamaCppSystem | None, args: argparse.Namespace) -> dict:
    """zerolayer's greedy ids for ``--greedy-prompts`` prompts against llama.cpp's."""
    vocab = 259
    prompts = random_prompts(args.greedy_prompts, args.greedy_prompt_tokens, vocab, seed=77)
    ours = [quality.zerolayer_greedy(address, p, args.greedy_tokens) for p in prompts]
    if llama is None:
        return {"zerolayer": ours}
    theirs = [llama.single.greedy([p], args.greedy_tokens).token_ids[0] for p in prompts]
    per = [quality.greedy_agreement(a, b) for a, b in zip(ours, theirs, strict=True)]
    return {
        "per_prompt": per,
        "prompts_identical": sum(p["shared_prefix"] == p["num_tokens"] for p in per),
        "num_prompts": len(per),
        "equal_positions": sum(p["equal_positions"] for p in per),
        "num_positions": sum(p["num_tokens"] for p in per),
    }


def mean_logliks(
    address: str, llama: LlamaCppSystem | None, model_dir: Path, args: argparse.Namespace
) -> dict:
    """Mean log-likelihood of the fixed text under each system (ids by the served tokenizer)."""
    ids = quality.zerolayer_tokenize(address, quality.QUALITY_TEXT)[: args.quality_tokens]
    out: dict = {"num_tokens": len(ids), "zerolayer": quality.zerolayer_mean_loglik(address, ids)}
    if (model_dir / "config.json").exists():
        out["float_model"] = quality.hf_mean_loglik(model_dir, ids)
    if llama is not None:
        logits = llama.single.prompt_logits(ids)
        out["llama_cpp"] = quality.mean_loglik_from_logits(logits, ids)
        out["relative_difference"] = quality.relative_difference(out["zerolayer"], out["llama_cpp"])
    return out


def measure_file(
    file_type: str,
    path: Path,
    llama: LlamaCppSystem | None,
    model_dir: Path,
    args: argparse.Namespace,
) -> dict:
    """Every measurement of one file: interleaved rounds, quality, memory."""
    config = StackConfig(
        model_dir=str(path),
        listen=f"127.0.0.1:{args.port}",
        log_dir=str(args.out / "logs" / f"zerolayer-{file_type}"),
        kv_cache_bytes=args.kv_cache_bytes,
    )
    vocab_size = vocab_size_of(model_dir)
    rounds = []
    with Stack(config) as stack:
        warm_up(config.listen, vocab_size)
        zerolayer = ZerolayerSystem("zerolayer", config.listen)
        systems = [zerolayer] + ([llama] if llama is not None else [])
        for r in range(args.rounds):
            rounds.append(measure_round(systems, round_prompts(r, vocab_size, args), args))
        memory = {"zerolayer": stack_memory(stack, path)}
        out = {
            "file": str(path),
            "file_bytes": path.stat().st_size,
            "rounds": rounds,
            "mean_loglik": mean_logliks(config.listen, llama, model_dir, args),
            "greedy": greedy(config.listen, llama, args),
        }
    if llama is not None:
        out.update(summarize(rounds, [llama.name], "zerolayer", MEASUREMENTS))
        memory["llama_cpp"] = llama_memory(path, llama_threads(args), args)
    else:
        out["median"] = {
            "zerolayer": {k: median([r["zerolayer"][k] for r in rounds]) for k in MEASUREMENTS}
        }
    out["memory"] = memory
    return out


def llama_threads(args: argparse.Namespace) -> int:
    """llama.cpp's threads: ``--llama-num-threads`` or one per core (its default)."""
    return args.llama_num_threads or num_cores()


def verdicts(file_type: str, result: dict) -> dict:
    """The issue's targets for one file, met or not (absent without llama.cpp)."""
    ratios = next(iter(result.get("ratios", {}).values()), None)
    if ratios is None:
        return {}
    out = {
        "decode_target": DECODE_TARGETS.get(file_type),
        "decode_ratio": ratios["decode_tok_s"],
        "throughput_target": THROUGHPUT_TARGET,
        "throughput_ratio": ratios["batch_output_tok_s"],
        "loglik_tolerance": LOGLIK_TOLERANCE,
        "loglik_relative_difference": result["mean_loglik"]["relative_difference"],
    }
    if out["decode_target"] is not None:
        out["decode_target_met"] = out["decode_ratio"] >= out["decode_target"]
    out["throughput_target_met"] = out["throughput_ratio"] >= THROUGHPUT_TARGET
    out["loglik_target_met"] = out["loglik_relative_difference"] <= LOGLIK_TOLERANCE
    return out


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    use_llama_cpp(args.llama_cpp)
    llama_reason = llama_cpp_available()
    if llama_reason:
        print(f"zerolayer bench gguf: llama.cpp skipped: {llama_reason}", file=sys.stderr)
    model_dir = model_dir_for(args)
    set_torch_threads(num_cores())
    files: dict = {}
    for file_type in [t for t in args.gguf_types.split(",") if t]:
        try:
            path = gguf_file(model_dir, args.out / "gguf", file_type, llama_reason)
        except RuntimeError as exc:
            print(f"zerolayer bench gguf: {file_type} skipped: {exc}", file=sys.stderr)
            files[file_type] = {"skipped": str(exc)}
            continue
        llama = None if llama_reason else open_llama(file_type, path, llama_threads(args), args)
        try:
            files[file_type] = measure_file(file_type, path, llama, model_dir, args)
        finally:
            if llama is not None:
                llama.close()
        files[file_type]["targets"] = verdicts(file_type, files[file_type])
    results = {
        "model": str(model_dir),
        "cpu_isa": os.environ.get("ZEROLAYER_CPU_ISA", "native"),
        "llama_cpp": {"skipped": llama_reason} if llama_reason else llama_cpp_record(args),
        "workload": workload(args),
        "files": files,
        "ratio_note": "zerolayer / llama.cpp on the same file, median of per-round ratios: above "
        "1 is better for tok/s, below 1 for TTFT",
    }
    plot(args.out / "gguf.png", files)
    return write_results(args, "gguf", results)


def llama_cpp_record(args: argparse.Namespace) -> dict:
    """Which llama.cpp ran: its library and system info, its threads."""
    import llama_cpp

    return {
        "library": os.environ.get("LLAMA_CPP_LIB_PATH", "llama-cpp-python's own"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "threads": llama_threads(args),
        "weight_repacking": True,
    }


def workload(args: argparse.Namespace) -> dict:
    """The measurements' shapes, for the results file."""
    return {
        "rounds": args.rounds,
        "batch1_decode": {
            "prompt_tokens": args.decode_prompt_tokens,
            "new_tokens": args.decode_tokens,
        },
        "ttft_prompt_tokens": args.ttft_prompt_tokens,
        "batch": {
            "num_requests": args.batch_requests,
            "prompt_tokens": args.batch_prompt_tokens,
            "max_new_tokens": args.batch_max_new_tokens,
        },
        "quality": {
            "text_tokens_at_most": args.quality_tokens,
            "greedy_prompts": args.greedy_prompts,
        },
        "greedy": True,
        "zerolayer": "zerolayer up's defaults, through the four layers, serving the GGUF file",
    }


def plot(path: Path, files: dict) -> None:
    """Bars of the medians per file and system."""
    panels: dict[str, dict[str, float]] = {}
    titles = {"decode_tok_s": "batch-1 decode tok/s", "batch_output_tok_s": "batch output tok/s"}
    for file_type, result in files.items():
        for system, values in result.get("median", {}).items():
            for key, title in titles.items():
                label = f"{'zerolayer' if system == 'zerolayer' else 'llama.cpp'} {file_type}"
                panels.setdefault(title, {})[label] = values[key]
    plot_bars(path, "zerolayer vs llama.cpp on the same GGUF files (medians)", panels)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (medians)")
    p.add_argument("--decode-prompt-tokens", type=at_least(1), default=32)
    p.add_argument("--decode-tokens", type=at_least(1), default=128)
    p.add_argument("--ttft-prompt-tokens", type=at_least(1), default=512)
    p.add_argument("--batch-requests", type=at_least(1), default=16)
    p.add_argument("--batch-prompt-tokens", type=at_least(1), default=256)
    p.add_argument("--batch-max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--greedy-prompts", type=at_least(1), default=8)
    p.add_argument("--greedy-prompt-tokens", type=at_least(1), default=16)
    p.add_argument("--greedy-tokens", type=at_least(1), default=32)
    p.add_argument("--quality-tokens", type=at_least(2), default=512, help="text tokens scored")
    p.add_argument(
        "--gguf-types",
        default="bf16,q8_0,q4_k_m",
        help="GGUF files to measure, comma-separated: f32, bf16, f16, q8_0, q4_k_m "
        "(default %(default)s)",
    )
    p.add_argument(
        "--llama-cpp",
        metavar="PREFIX",
        help="a llama.cpp build (scripts/build_llama_cpp.sh): its PREFIX/lib is loaded by "
        "llama-cpp-python (default: llama-cpp-python's own library)",
    )
    p.add_argument(
        "--llama-num-threads",
        type=at_least(0),
        default=0,
        help="llama.cpp threads; 0: one per core",
    )
