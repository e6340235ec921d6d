"""``zerolayer bench SCENARIO``: run a benchmark scenario and write JSON + PNG.

A command plugin of the ``zerolayer`` CLI: pyproject.toml registers this module under the
``zerolayer.commands`` entry point group (``add_parser`` and ``run``), so the product never
imports the benchmarks. From a checkout, the scenarios and baselines of its ``benchmarks/``
folder join in (:mod:`zerolayer.bench.checkout`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

from zerolayer.bench.checkout import baseline_for, checkout_scenarios
from zerolayer.bench.cpu_isa import cpu_line, emulate_cpu_isa
from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.cli.presets import PRESET_NAMES
from zerolayer.common.setting import parse_bytes
from zerolayer.stack.preflight import bind_error

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
    "agent",
)
"""The wheel's scenarios: each a module of this package with ``HELP``, ``SMOKE``,
``add_arguments(p)`` and ``main(args) -> dict``, and optionally ``PRESET`` (its default
``--preset`` instead of small) and ``KV_CACHE_BYTES = None`` (no default ``--kv-cache-bytes``:
the scenario sizes the pool itself; otherwise 1G)."""

REQUIREMENTS = ("matplotlib",)
"""The packages of the ``bench`` extra a scenario imports unless it says otherwise (its
``REQUIREMENTS``; a baseline adds its own), checked before it starts anything."""
BENCH_EXTRA = "pip install 'zerolayer[bench]'"
"""How to install them (from a clone: ``.venv/bin/pip install -e '.[bench]'``)."""

HELP = "run a benchmark scenario: JSON results and a plot"
"""``bench``'s line in ``zerolayer --help`` (shown without importing the scenarios)."""
DESCRIPTION = (
    "Runs a benchmark scenario on this machine and writes its results (JSON) and a plot (PNG) "
    "to --out. From a checkout of zerolayer, scenarios also run their baseline (another system "
    "on the same workload) and report the ratios; docs/benchmarks.md has the results."
)
"""``zerolayer bench --help``'s description."""


def scenario_modules() -> dict[str, str]:
    """Module name of every scenario: the wheel's, then those only a checkout has."""
    return {**{name: f"zerolayer.bench.{name}" for name in SCENARIOS}, **checkout_scenarios()}


def _help(module: ModuleType, baseline: ModuleType | None) -> str:
    return f"{module.HELP}; against {baseline.SYSTEM}" if baseline else module.HELP


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``bench`` and its scenarios to the zerolayer command line (imports each scenario).

    First, before any scenario imports torch: with ``ZEROLAYER_CPU_ISA=avx2``, caps torch's,
    oneDNN's and MKL's instruction sets at AVX2 in this process's environment, which every
    process the run starts inherits (:func:`zerolayer.bench.cpu_isa.emulate_cpu_isa`).
    """
    emulate_cpu_isa(os.environ)
    p = sub.add_parser("bench", help=HELP, description=DESCRIPTION)
    scenarios = p.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, module_name in scenario_modules().items():
        module, baseline = importlib.import_module(module_name), baseline_for(name)
        s = scenarios.add_parser(name, help=_help(module, baseline))
        preset = getattr(module, "PRESET", "small")
        s.add_argument(
            "--preset",
            default=preset,
            choices=PRESET_NAMES,
            help=f"dummy model preset (tiny, small, medium, 1b); default {preset}",
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
        kv_cache_bytes = getattr(module, "KV_CACHE_BYTES", 1 << 30)
        s.add_argument(
            "--kv-cache-bytes",
            type=parse_bytes,
            default=kv_cache_bytes,
            help="KV arena of the stacks, bytes or with a unit such as 512M (default "
            + ("sized by the scenario)" if kv_cache_bytes is None else "1G)"),
        )
        s.add_argument(
            "--smoke",
            action="store_true",
            help="a short run on the tiny model, to see that the scenario works (CI runs one); "
            "it evaluates no target",
        )
        module.add_arguments(s)
        if baseline is not None:
            baseline.add_arguments(s)


def missing_requirements(scenario: str) -> list[str]:
    """The packages ``scenario`` and its baseline need that cannot be imported here (looked up,
    not imported)."""
    module = importlib.import_module(scenario_modules()[scenario])
    baseline = baseline_for(scenario)
    needed = [
        *getattr(module, "REQUIREMENTS", REQUIREMENTS),
        *(baseline.REQUIREMENTS if baseline else ()),
    ]
    return [name for name in dict.fromkeys(needed) if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    """Runs the chosen scenario and prints its results; exit code 2, before anything starts,
    when a package it needs is missing (one line naming the packages and the extra) or
    ``--port`` is taken, and when the checkpoint is refused (one line)."""
    missing = missing_requirements(args.scenario)
    if missing:
        print(
            f"zerolayer bench {args.scenario}: error: needs {', '.join(missing)}, not installed: "
            f"{BENCH_EXTRA} (from a clone: .venv/bin/pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2
    taken = bind_error("127.0.0.1", args.port)
    if taken:  # NOTE: before the baseline runs: the stacks would fail on it after it
        print(
            f"zerolayer bench {args.scenario}: error: --port {args.port}: {taken} "
            "(another bench or stack? choose another with --port)",
            file=sys.stderr,
        )
        return 2
    args.command = "zerolayer " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    module = importlib.import_module(scenario_modules()[args.scenario])
    if args.smoke:
        baseline = baseline_for(args.scenario)
        args.preset = "tiny"
        for name, value in {**module.SMOKE, **(baseline.SMOKE if baseline else {})}.items():
            setattr(args, name, value)
    try:
        results = module.main(args)
    except CheckpointError as exc:
        # e.g. --model not a checkpoint, or int8's --group-size not dividing a weight's K
        print(f"zerolayer bench {args.scenario}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2))
    # NOTE: on stderr: stdout is the results document alone (scripts parse it)
    print(
        f"zerolayer bench {args.scenario}: measured on {cpu_line(results['machine'])}",
        file=sys.stderr,
    )
    return 0
