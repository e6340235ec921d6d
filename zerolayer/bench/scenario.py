"""Plumbing every scenario shares: the model, the stack's settings, torch threads, warm-up."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from zerolayer.bench.streams import generate_request, num_cores, random_prompts, run_streams
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.cli.arg_types import at_least, comma_separated
from zerolayer.common.config import default_num_threads
from zerolayer.stack.launcher import StackConfig

WARMUP_SEED = 10_000
"""Seed of warm-up prompts (never shared with measured ones, so no prefix-cache hit)."""


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    """``--num-threads``: torch threads of whichever side is being measured."""
    p.add_argument(
        "--num-threads",
        type=at_least(0),
        default=0,
        help="torch threads of every measured side; 0 (default): each side's own default "
        "(zerolayer: the scheduler's, one per core with a short OpenMP spin; transformers and the "
        "in-process engine: one per core). Sides are measured one at a time.",
    )


def add_batch_sizes_argument(p: argparse.ArgumentParser) -> None:
    """``--batch-sizes``: the numbers of requests decoding together, each measured in turn."""
    p.add_argument(
        "--batch-sizes",
        type=comma_separated(at_least(1)),
        default="1,16",
        help="requests decoding together, comma-separated, each measured (default %(default)s)",
    )


def measured_threads(args: argparse.Namespace) -> int:
    """The torch thread count of the in-process sides (transformers, the engine as a library)."""
    return args.num_threads or num_cores()


def zerolayer_threads(args: argparse.Namespace) -> int:
    """The torch thread count of zerolayer's scheduler: ``--num-threads`` or its default (the
    number the scheduler picks for ``--num-threads 0``, which the stack is started with)."""
    return args.num_threads or default_num_threads(num_cores())


def set_torch_threads(num_threads: int) -> None:
    """Sets this process's torch intra-op threads (before it measures its own compute)."""
    import torch

    torch.set_num_threads(num_threads)


def model_dir_for(args: argparse.Namespace) -> Path:
    """``--model`` or the cached dummy checkpoint of ``--preset`` (written once)."""
    return Path(args.model) if args.model else ensure_dummy_model(args.preset)


def vocab_size_of(model_dir: Path) -> int:
    """``vocab_size`` from the checkpoint's config.json (a GGUF file's: from its metadata)."""
    config = model_dir / "config.json"
    if config.is_file():
        return json.loads(config.read_text())["vocab_size"]
    return json.loads(read_checkpoint(model_dir).config_json)["vocab_size"]


def stack_config(args: argparse.Namespace, model_dir: Path, **overrides: object) -> StackConfig:
    """The four layers on ``--port`` with ``--num-threads`` (0: the scheduler's default) or
    ``num_threads`` of ``overrides``, logs in ``<out>/logs``."""
    if "num_threads" not in overrides:
        overrides["num_threads"] = args.num_threads
    settings: dict[str, object] = {
        "model_dir": str(model_dir),
        "listen": f"127.0.0.1:{args.port}",
        "log_dir": str(args.out / "logs"),
        "kv_cache_bytes": args.kv_cache_bytes,
        **overrides,
    }
    return StackConfig(**settings)  # type: ignore[arg-type]


def warm_up(address: str, vocab_size: int, num_prompt_tokens: int = 32) -> None:
    """Two short requests, so first-call costs (allocations, lazy imports) are not measured."""
    prompts = random_prompts(2, num_prompt_tokens, vocab_size, WARMUP_SEED)
    run_streams(address, [generate_request(p, 4) for p in prompts], [0.0, 0.0])
