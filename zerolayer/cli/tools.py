"""``zerolayer convert-llama2c``, ``make-dummy`` and ``quantize``: the checkpoint tools."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from zerolayer.checkpoints.chat_templates import CHAT_TEMPLATES
from zerolayer.cli.presets import PRESET_NAMES


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Adds ``convert-llama2c``, ``make-dummy`` and ``quantize`` to the ``zerolayer``
    subcommands."""
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
    p.add_argument("out_dir", type=Path, help="directory to write (missing or empty)")
    p = sub.add_parser("make-dummy", help="write a seeded random-weight Llama directory")
    p.add_argument("out_dir", type=Path, help="directory to write (missing or empty)")
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
    p.add_argument(
        "--chat-template",
        choices=sorted(CHAT_TEMPLATES),
        help="also write this standard chat template (chat_template.jinja), so that chat "
        "requests (zerolayer generate --message, /v1/chat/completions) work on the model; "
        "default: none",
    )
    p = sub.add_parser(
        "quantize",
        help="write an int8 (weight-only) copy of a checkpoint",
        description="Write an int8 copy of a Hugging Face checkpoint that zerolayer up --model "
        "serves: every projection weight and the LM head become int8 with one float32 scale per "
        "group of K elements (symmetric, like llama.cpp's Q8_0); embeddings and norms stay.",
    )
    p.add_argument("in_dir", type=Path, help="the model directory to quantize")
    p.add_argument("out_dir", type=Path, help="directory to write (missing or empty)")
    p.add_argument(
        "--group-size",
        type=int,
        default=32,
        help="weights per scale along each row (default 32); must divide every K",
    )


def run_convert_llama2c(args: argparse.Namespace) -> int:
    """Runs ``convert-llama2c``; returns 0, or 2 with one line on stderr naming the argument at
    fault (a missing or malformed input, an output directory that cannot be written)."""
    from zerolayer.checkpoints.llama2c import Llama2cInputError, convert_llama2c

    return _write(
        "convert-llama2c",
        args.out_dir,
        lambda: convert_llama2c(args.checkpoint, args.tokenizer, args.out_dir),
        Llama2cInputError,
    )


def run_make_dummy(args: argparse.Namespace) -> int:
    """Runs ``make-dummy``; returns 0, or 2 with one line on stderr for an output directory that
    is there and not empty (nothing is overwritten, as ``convert-llama2c`` and ``quantize``
    refuse one) or cannot be written."""
    from zerolayer.checkpoints.chat_templates import write_chat_template
    from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model

    def write() -> None:
        out_dir = args.out_dir
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise ValueError(f"out_dir {out_dir}: exists and is not an empty directory")
        write_dummy_model(out_dir, PRESETS[args.preset], args.seed)
        if args.chat_template:
            write_chat_template(out_dir, args.chat_template)

    return _write("make-dummy", args.out_dir, write, ValueError)


def run_quantize(args: argparse.Namespace) -> int:
    """Runs ``quantize`` (imports torch); returns 0, or 2 with one line on stderr (a missing or
    already quantized input, a K the group size does not divide, a non-float weight, an output
    directory that is not empty or cannot be written)."""
    from zerolayer.checkpoints.errors import CheckpointError
    from zerolayer.checkpoints.quantize import quantize_checkpoint

    # NOTE: SIGTERM unwinds like Ctrl-C, so the partial copy is removed (quantize_checkpoint);
    # the caller's handler is back afterwards (the command may run inside another program).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _write(
            "quantize",
            args.out_dir,
            lambda: quantize_checkpoint(args.in_dir, args.out_dir, args.group_size),
            CheckpointError,
        )
    except KeyboardInterrupt:
        print("zerolayer quantize: interrupted; nothing written", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write(
    command: str, out_dir: Path, write: Callable[[], object], input_error: type[Exception]
) -> int:
    """Runs ``write``: 0 and "wrote OUT_DIR", or 2 and one line on stderr for an
    ``input_error`` or an OSError (then about ``out_dir``)."""
    try:
        write()
    except input_error as exc:
        line = str(exc)
    except OSError as exc:
        line = f"out_dir {out_dir}: {exc.strerror or exc}"
    else:
        print(f"wrote {out_dir}")
        return 0
    print(f"zerolayer {command}: error: {line}", file=sys.stderr)
    return 2
