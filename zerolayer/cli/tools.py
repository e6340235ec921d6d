"""``zerolayer convert-llama2c`` and ``zerolayer make-dummy``: the checkpoint tools."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerolayer.cli.presets import PRESET_NAMES


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Adds ``convert-llama2c`` and ``make-dummy`` to the ``zerolayer`` subcommands."""
    p = sub.add_parser(
        "convert-llama2c",
        help="convert a llama2.c checkpoint to a Hugging Face directory",
        description="Convert a legacy (version 0) llama2.c checkpoint and its tokenizer into a "
        "Hugging Face Llama directory that zerolayer up --model serves.",
    )
    p.add_argument(
        "checkpoint", type=Path, help="the llama2.c model file, e.g. stories15M.bin (first)"
    )
    p.add_argument(
        "tokenizer", type=Path, help="the llama2.c tokenizer file, e.g. tokenizer.bin (second)"
    )
    p.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    p = sub.add_parser("make-dummy", help="write a seeded random-weight Llama directory")
    p.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    p.add_argument(
        "--preset",
        default="tiny",
        choices=PRESET_NAMES,
        help="tiny (default: fp32, a 259-token byte vocabulary, random bytes as text), or the "
        "bf16 Llama shapes small (125M), medium (~0.5B) and 1b (1.1B), whose 32000-token "
        "vocabulary on the same byte tokenizer decodes almost every token to nothing: their "
        "text is (nearly) empty; for speed, not text",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")


def run_convert_llama2c(args: argparse.Namespace) -> int:
    """Runs ``convert-llama2c``; returns 0, or 2 with one line on stderr naming the argument at
    fault (a missing or malformed input, an output directory that cannot be written)."""
    from zerolayer.checkpoints.llama2c import Llama2cInputError, convert_llama2c

    try:
        convert_llama2c(args.checkpoint, args.tokenizer, args.out_dir)
    except Llama2cInputError as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"out_dir {args.out_dir}: {exc.strerror or exc}")
    print(f"wrote {args.out_dir}")
    return 0


def run_make_dummy(args: argparse.Namespace) -> int:
    """Runs ``make-dummy``; returns 0."""
    from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model

    write_dummy_model(args.out_dir, PRESETS[args.preset], args.seed)
    print(f"wrote {args.out_dir}")
    return 0


def _error(line: str) -> int:
    print(f"zerolayer convert-llama2c: error: {line}", file=sys.stderr)
    return 2
