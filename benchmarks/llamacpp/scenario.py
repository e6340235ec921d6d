"""llama.cpp: zerolayer against llama.cpp (BF16, Q8_0) and transformers on the same checkpoint.

The checkpoint is converted to GGUF (:mod:`benchmarks.llamacpp.gguf_export`) and the conversion
is checked against transformers in float32 (:mod:`benchmarks.llamacpp.gguf_exactness`). Every
system gets the same prompts as token ids. Measured in interleaved rounds (each round measures
every system once per measurement, so a noisy neighbour hits all of them alike), reported as
medians and as the median of per-round ratios zerolayer / baseline: batch-1 decode tok/s, the
time to the first token of a long prompt, the output tok/s of a batch sent at once (prefill
included), and online serving with Poisson arrivals against ``llama-server`` (parallel slots,
continuous batching).

zerolayer runs with ``zerolayer up``'s defaults (threads included) unless
``--zerolayer-num-threads`` is given; llama.cpp gets one thread per core, its own default. The
llama.cpp side needs the ``bench`` extra's llama-cpp-python and gguf (and a built ``llama-server``
for the online part): without them it is skipped with a message and the zerolayer side still
runs. A scenario of a checkout only (``benchmarks/``, not in the wheel).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from benchmarks.llamacpp.baselines import start_llama
from benchmarks.llamacpp.systems import (
    ZEROLAYER_VARIANTS,
    HfSystem,
    ZerolayerSystem,
    ZerolayerVariant,
)
from zerolayer.bench.common import median, write_results
from zerolayer.bench.latency import latency_summary, poisson_offsets
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import model_dir_for, set_torch_threads, vocab_size_of, warm_up
from zerolayer.bench.streams import generate_request, num_cores, random_prompts, run_streams
from zerolayer.cli.arg_types import at_least, positive
from zerolayer.common.config import default_num_threads
from zerolayer.stack.launcher import Stack, StackConfig

HELP = "zerolayer against llama.cpp (BF16, Q8_0), llama-server and transformers"
"""The scenario's line in ``zerolayer bench --help``."""
REQUIREMENTS = ("matplotlib", "transformers")
"""The packages it cannot run without (llama-cpp-python and gguf: the llama.cpp side is skipped
with a message when they are missing)."""
SMOKE = {
    "rounds": 1,
    "decode_prompt_tokens": 8,
    "decode_tokens": 16,
    "ttft_prompt_tokens": 16,
    "batch_requests": 4,
    "batch_prompt_tokens": 16,
    "batch_max_new_tokens": 8,
    "online_requests": 4,
    "online_rate": 8.0,
    "online_prompt_tokens": 16,
    "online_max_new_tokens": 8,
    "online_slots": 4,
    # The int8 variant has a smoke run of its own (zerolayer bench int8 --smoke).
    "zerolayer_variants": "zerolayer",
}
"""Overrides of ``--smoke``."""

MEASUREMENTS = ("decode_tok_s", "ttft_s", "batch_output_tok_s")


def prompts_of_round(r: int, vocab_size: int, args: argparse.Namespace) -> dict:
    """The round's prompts (distinct per round, so no prefix-cache hit), the same for every
    system."""
    seed = 1000 * (r + 1)
    return {
        "decode": random_prompts(1, args.decode_prompt_tokens, vocab_size, seed)[0],
        "ttft": random_prompts(1, args.ttft_prompt_tokens, vocab_size, seed + 1)[0],
        "batch": random_prompts(
            args.batch_requests, args.batch_prompt_tokens, vocab_size, seed + 2
        ),
        "online": random_prompts(
            args.online_requests, args.online_prompt_tokens, vocab_size, seed + 3
        ),
    }


def measure_round(systems: list, prompts: dict, args: argparse.Namespace) -> dict:
    """Every measurement of every system, systems alternating within each measurement."""
    out: dict[str, dict] = {s.name: {} for s in systems}
    for s in systems:
        out[s.name]["decode_tok_s"] = s.decode_tok_s(prompts["decode"], args.decode_tokens)
    for s in systems:
        out[s.name]["ttft_s"] = s.ttft_s(prompts["ttft"])
    for s in systems:
        out[s.name]["batch_output_tok_s"] = s.batch_output_tok_s(
            prompts["batch"], args.batch_max_new_tokens
        )
    return out


def online_round(
    zerolayer: ZerolayerSystem, servers: dict, prompts: dict, r: int, args: argparse.Namespace
) -> dict:
    """The same Poisson schedule of the same prompts against zerolayer and each llama-server."""
    offsets = poisson_offsets(args.online_rate, args.online_requests, seed=r)
    n = args.online_max_new_tokens
    requests = [generate_request(p, n) for p in prompts["online"]]
    out = {zerolayer.name: latency_summary(run_streams(zerolayer.address, requests, offsets))}
    for name, server in servers.items():
        out[name] = latency_summary(server.run_scheduled(prompts["online"], offsets, n))
    return out


def summarize(rounds: list[dict], baseline_names: list[str], zerolayer: str, keys: tuple) -> dict:
    """Medians over rounds per system, and the median of per-round ratios zerolayer / baseline."""
    systems = rounds[0]
    return {
        "median": {s: {k: median([r[s][k] for r in rounds]) for k in keys} for s in systems},
        "ratios": {
            f"{zerolayer} / {b}": {
                k: median([r[zerolayer][k] / r[b][k] for r in rounds]) for k in keys
            }
            for b in baseline_names
        },
    }


def zerolayer_stack(
    variant: ZerolayerVariant, model_dir: Path, args: argparse.Namespace
) -> StackConfig:
    """``zerolayer up``'s defaults on the variant's checkpoint (threads only if asked for)."""
    settings: dict[str, object] = {
        "model_dir": str(variant.checkpoint(model_dir, args.out)),
        "listen": f"127.0.0.1:{args.port}",
        "log_dir": str(args.out / "logs" / variant.name.replace(" ", "-")),
        "kv_cache_bytes": args.kv_cache_bytes,
        **variant.stack_overrides,
    }
    if args.zerolayer_num_threads:
        settings["num_threads"] = args.zerolayer_num_threads
    return StackConfig(**settings)  # type: ignore[arg-type]


def warm_up_baselines(systems: list, servers: dict, vocab_size: int) -> None:
    """One short run of each, so first-call costs are not measured."""
    prompt = random_prompts(1, 8, vocab_size, seed=7)[0]
    for s in systems:
        s.decode_tok_s(prompt, 4)
        s.batch_output_tok_s([prompt, prompt], 2)
    for server in servers.values():
        server.stream(prompt, 2)


def run_variant(
    variant: ZerolayerVariant,
    model_dir: Path,
    baselines: list,
    servers: dict,
    args: argparse.Namespace,
) -> dict:
    """The variant's stack, measured in ``--rounds`` rounds interleaved with every baseline."""
    vocab_size = vocab_size_of(model_dir)
    config = zerolayer_stack(variant, model_dir, args)
    rounds, online = [], []
    with Stack(config):
        warm_up(config.listen, vocab_size)
        zerolayer = ZerolayerSystem(variant.name, config.listen)
        systems = [zerolayer, *baselines]
        for r in range(args.rounds):
            prompts = prompts_of_round(r, vocab_size, args)
            rounds.append(measure_round(systems, prompts, args))
            online.append(online_round(zerolayer, servers, prompts, r, args))
    names = [b.name for b in baselines]
    out = {"rounds": rounds, **summarize(rounds, names, variant.name, MEASUREMENTS)}
    keys = ("output_tok_s", "ttft_p50_s", "ttft_p99_s")
    out["online"] = {"rounds": online, **summarize(online, list(servers), variant.name, keys)}
    return out


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    cores = num_cores()
    llama_threads = args.llama_num_threads or cores
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    gguf_types = [t for t in args.gguf_types.split(",") if t]
    names = args.zerolayer_variants.split(",") if args.zerolayer_variants else None
    variants = [v for v in ZEROLAYER_VARIANTS if names is None or v.name in names]
    set_torch_threads(cores)
    baselines: list = []
    with contextlib.ExitStack() as stack:
        llama, llama_systems, servers = start_llama(
            model_dir, gguf_types, llama_threads, stack, args
        )
        baselines += llama_systems
        if not args.no_hf:
            from benchmarks.hf.generate import load_hf

            baselines.append(HfSystem("transformers", load_hf(model_dir)))
        warm_up_baselines(baselines, servers, vocab_size)
        per_variant = {
            v.name: run_variant(v, model_dir, baselines, servers, args) for v in variants
        }
    results = {
        "model": str(model_dir),
        "workload": workload(args),
        "threads": {
            "zerolayer_scheduler": args.zerolayer_num_threads or default_num_threads(cores),
            "zerolayer_threads_from": "--zerolayer-num-threads"
            if args.zerolayer_num_threads
            else "zerolayer up's default",
            "llama_cpp": llama_threads,
            "llama_server": llama_threads,
            "hf_transformers": cores,
        },
        "llama_cpp": llama,
        "variants": per_variant,
        "ratio_note": "zerolayer / baseline, median of per-round ratios: above 1 is better for "
        "tok/s, below 1 is better for TTFT",
    }
    plot(args.out / "llamacpp.png", per_variant)
    return write_results(args, "llamacpp", results)


def workload(args: argparse.Namespace) -> dict:
    """The measurements' shapes, for the results file."""
    return {
        "rounds": args.rounds,
        "batch1_decode": {
            "prompt_tokens": args.decode_prompt_tokens,
            "max_new_tokens": args.decode_tokens,
        },
        "ttft": {"prompt_tokens": args.ttft_prompt_tokens},
        "batch": {
            "num_requests": args.batch_requests,
            "prompt_tokens": args.batch_prompt_tokens,
            "max_new_tokens": args.batch_max_new_tokens,
            "output_tok_s": "generated tokens / (first send to last token), prefill included",
        },
        "online": {
            "rate_per_s": args.online_rate,
            "num_requests": args.online_requests,
            "prompt_tokens": args.online_prompt_tokens,
            "max_new_tokens": args.online_max_new_tokens,
            "llama_server_slots": args.online_slots,
            "arrivals": "Poisson (seeded), the same schedule for every system",
        },
        "greedy": True,
        "ignore_eos": True,
        "prompts": "random token ids, the same for every system within a round",
    }


def plot(path: Path, per_variant: dict) -> None:
    """Bars of the medians: every system of every variant's rounds."""
    panels: dict[str, dict[str, float]] = {}
    titles = {
        "decode_tok_s": "batch-1 decode tok/s",
        "ttft_s": "TTFT (ms)",
        "batch_output_tok_s": "batch output tok/s",
    }
    for variant in per_variant.values():
        for key, title in titles.items():
            scale = 1e3 if key == "ttft_s" else 1.0
            for system, values in variant["median"].items():
                panels.setdefault(title, {})[system] = values[key] * scale
        for system, values in variant["online"]["median"].items():
            panels.setdefault("online output tok/s", {})[system] = values["output_tok_s"]
    plot_bars(path, "zerolayer vs llama.cpp and transformers (medians of rounds)", panels)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (medians)")
    p.add_argument("--decode-prompt-tokens", type=at_least(1), default=32)
    p.add_argument(
        "--decode-tokens", type=at_least(1), default=128, help="batch-1 decode: new tokens"
    )
    p.add_argument("--ttft-prompt-tokens", type=at_least(1), default=512)
    p.add_argument("--batch-requests", type=at_least(1), default=16)
    p.add_argument("--batch-prompt-tokens", type=at_least(1), default=256)
    p.add_argument("--batch-max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--online-rate", type=positive, default=2.0, help="Poisson arrivals per second")
    p.add_argument("--online-requests", type=at_least(1), default=32)
    p.add_argument("--online-prompt-tokens", type=at_least(1), default=256)
    p.add_argument("--online-max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--online-slots", type=at_least(1), default=16, help="llama-server --parallel")
    p.add_argument("--exactness-tokens", type=at_least(1), default=16)
    p.add_argument(
        "--gguf-types",
        default="bf16,q8_0",
        help="llama.cpp weight types to measure, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--zerolayer-variants",
        default="",
        help="comma-separated names of zerolayer variants (default: all of "
        + ", ".join(v.name for v in ZEROLAYER_VARIANTS)
        + ")",
    )
    p.add_argument(
        "--zerolayer-num-threads",
        type=at_least(0),
        default=0,
        help="the stack's --num-threads; 0: zerolayer up's default",
    )
    p.add_argument(
        "--llama-num-threads",
        type=at_least(0),
        default=0,
        help="llama.cpp threads; 0: one per core",
    )
    p.add_argument(
        "--llama-server",
        help="llama-server binary (default: on PATH, else where scripts/build_llama_server.sh "
        "puts it)",
    )
    p.add_argument("--no-hf", action="store_true", help="leave transformers out")
