"""``zerolayer bench SCENARIO``: run a benchmark against its baseline and write JSON + PNG.

A command plugin of the ``zerolayer`` CLI: pyproject.toml registers this module under the
``zerolayer.commands`` entry point group (``add_parser`` and ``run``), so the product never
imports the benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.cli.presets import PRESET_NAMES
from zerolayer.common.setting import parse_bytes

SCENARIOS = (
    "multiturn",
    "chat",
    "throughput",
    "latency",
    "coldstart",
    "split",
    "roofline",
    "failover",
    "threads",
    "int8",
    "llamacpp",
)
"""Each is a module of this package with ``add_arguments(p)`` and ``main(args) -> dict``."""

REQUIREMENTS = {
    **dict.fromkeys(SCENARIOS, ("matplotlib", "transformers")),
    "split": ("matplotlib",),
    "failover": ("matplotlib",),
    "threads": ("matplotlib",),
    "int8": ("matplotlib",),
}
"""The packages of the ``bench`` extra each scenario imports (matplotlib for its plot,
transformers for its Hugging Face baseline), checked before it starts anything."""
BENCH_EXTRA = "pip install 'zerolayer[bench]'"
"""How to install them (from a clone: ``.venv/bin/pip install -e '.[bench]'``)."""

MULTITURN_SMOKE = {"turns": 2, "repeats": 1, "message_tokens": 8, "answer_tokens": 4}
"""What ``--smoke`` changes for multiturn; the other scenarios declare their own ``SMOKE``."""


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"zerolayer.bench.{name}")


HELP = "run a benchmark scenario against its baseline"
"""``bench``'s line in ``zerolayer --help`` (shown without importing the scenarios)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``bench`` and its scenarios to the zerolayer command line (imports each scenario)."""
    p = sub.add_parser("bench", help=HELP)
    scenarios = p.add_subparsers(dest="scenario", required=True)
    for name in SCENARIOS:
        module = _module(name)
        s = scenarios.add_parser(name, help=module.__doc__.splitlines()[0].replace("``", "`"))
        s.add_argument(
            "--preset",
            default="small",
            choices=PRESET_NAMES,
            help="dummy model preset (tiny, small, medium, 1b); default small",
        )
        s.add_argument("--model", help="a model directory instead of a preset")
        s.add_argument(
            "--out",
            type=Path,
            default=Path("bench-results"),
            help="where JSON, PNG and logs go (default ./bench-results)",
        )
        s.add_argument(
            "--port", type=int, default=50071, help="frontend port of the stacks (default 50071)"
        )
        s.add_argument(
            "--kv-cache-bytes",
            type=parse_bytes,
            default=1 << 30,
            help="KV arena of the stacks, bytes or with a unit such as 512M (default 1G)",
        )
        s.add_argument(
            "--smoke",
            action="store_true",
            help="seconds-long run on the tiny model (CI checks it runs)",
        )
        module.add_arguments(s)


def missing_requirements(scenario: str) -> list[str]:
    """The packages of :data:`REQUIREMENTS` ``scenario`` needs that cannot be imported here
    (looked up, not imported)."""
    return [name for name in REQUIREMENTS[scenario] if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    """Runs the chosen scenario and prints its results; exit code 2, before anything starts,
    when a package it needs is missing (one line naming the packages and the extra), and when
    the checkpoint is refused (one line)."""
    missing = missing_requirements(args.scenario)
    if missing:
        print(
            f"zerolayer bench {args.scenario}: error: needs {', '.join(missing)}, not installed: "
            f"{BENCH_EXTRA} (from a clone: .venv/bin/pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2
    args.command = "zerolayer " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    module = _module(args.scenario)
    if args.smoke:
        args.preset = "tiny"
        for name, value in getattr(module, "SMOKE", MULTITURN_SMOKE).items():
            setattr(args, name, value)
    try:
        results = module.main(args)
    except CheckpointError as exc:
        # e.g. --model not a checkpoint, or int8's --group-size not dividing a weight's K
        print(f"zerolayer bench {args.scenario}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2))
    return 0
