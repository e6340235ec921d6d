"""The scheduler's thread default against explicit thread counts, quiet and beside a busy process.

Each setting starts the four layers afresh (OpenMP reads its environment once, when torch loads
libgomp) and streams batch-1 (and other batch sizes') decodes through the services. A setting is
a torch thread count (0: the scheduler's default) and the OpenMP spin count the scheduler
process starts with (none: the scheduler's default waiting policy). The same settings run again
with one busy process (a Python busy loop, as a neighbour on a shared machine would be) beside
the stack. Targets (issue 18): the default reaches at least 90% of the best explicit thread
count on a quiet machine, and at least half of its own quiet figure beside a busy process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from zerolayer.bench.common import median, write_results
from zerolayer.bench.plots import plot_bars
from zerolayer.bench.scenario import (
    add_batch_sizes_argument,
    model_dir_for,
    stack_config,
    vocab_size_of,
    warm_up,
)
from zerolayer.bench.streams import (
    decode_tok_s,
    generate_request,
    num_cores,
    random_prompts,
    run_streams,
)
from zerolayer.cli.arg_types import at_least, comma_separated
from zerolayer.scheduler.openmp_waiting import SPIN_COUNT_ENV, WAIT_POLICY_ENV
from zerolayer.stack.launcher import Stack

HELP = "the scheduler's default threads against explicit counts, quiet and beside a busy process"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {
    "batch_sizes": "1",
    "prompt_tokens": 16,
    "max_new_tokens": 16,
    "repeats": 1,
    "only": "default,1 threads",
}
"""Overrides of ``--smoke``."""

OPENMP_ENV = (WAIT_POLICY_ENV, SPIN_COUNT_ENV)
"""The OpenMP variables a setting may set; a setting without one runs with it unset (so the
scheduler's own default applies: see zerolayer.scheduler.openmp_waiting)."""


@dataclass(frozen=True)
class ThreadSetting:
    """One way of running the scheduler.

    Attributes:
        label: the name in the results.
        num_threads: torch intra-op threads; 0: the scheduler's default.
        openmp_env: OMP_WAIT_POLICY / GOMP_SPINCOUNT for the stack's processes; empty: neither
            set (the scheduler's own default, what a user gets).
    """

    label: str
    num_threads: int
    openmp_env: dict[str, str] = field(default_factory=dict)


def settings_for(cores: int, spin_counts: list[str]) -> list[ThreadSetting]:
    """The default, each explicit count 1..``cores`` (with the scheduler's waiting policy) and,
    at ``cores`` threads, each GOMP spin count of ``spin_counts`` (300000 is libgomp's own
    default: spin, then sleep)."""
    out = [ThreadSetting("default", 0)]
    out += [ThreadSetting(f"{n} threads", n) for n in range(1, cores + 1)]
    out += [
        ThreadSetting(f"{cores} threads spin {s}", cores, {"GOMP_SPINCOUNT": s})
        for s in spin_counts
    ]
    return out


@contextlib.contextmanager
def openmp_environment(overrides: dict[str, str]) -> Iterator[None]:
    """This process's environment (which the stack's processes inherit) without any of
    :data:`OPENMP_ENV` but ``overrides``, restored on exit."""
    saved = {name: os.environ.get(name) for name in OPENMP_ENV}
    for name in OPENMP_ENV:
        os.environ.pop(name, None)
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def busy_neighbour() -> Iterator[None]:
    """One Python busy loop beside the stack while the block runs."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def decode_rates(
    args: argparse.Namespace, address: str, vocab_size: int, batch_sizes: list[int]
) -> dict:
    """Median decode tok/s per batch size (str) through the stack at ``address``."""
    out = {}
    for b in batch_sizes:
        rates = []
        for r in range(args.repeats):
            prompts = random_prompts(b, args.prompt_tokens, vocab_size, 1000 * b + r)
            requests = [generate_request(p, args.max_new_tokens) for p in prompts]
            rates.append(decode_tok_s(run_streams(address, requests, [0.0] * b)))
        out[str(b)] = median(rates)
    return out


def measure(args: argparse.Namespace, setting: ThreadSetting, batch_sizes: list[int]) -> dict:
    """``{"quiet": rates, "busy": rates}`` of ``setting`` through one fresh stack: first alone,
    then beside a busy process (see :func:`decode_rates`)."""
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    config = stack_config(args, model_dir, num_threads=setting.num_threads)
    with openmp_environment(setting.openmp_env), Stack(config):
        warm_up(config.listen, vocab_size)
        quiet = decode_rates(args, config.listen, vocab_size, batch_sizes)
        with busy_neighbour():
            busy = decode_rates(args, config.listen, vocab_size, batch_sizes)
    return {"quiet": quiet, "busy": busy}


def verdict(results: dict, batch_sizes: list[int]) -> dict:
    """Per batch size: default / best explicit thread count (quiet) and default busy / quiet;
    empty unless the default and another setting were measured."""
    out = {}
    if "default" not in results["quiet"] or len(results["quiet"]) < 2:
        return out  # nothing to compare the default with (--only)
    for b in map(str, batch_sizes):
        quiet = {label: r[b] for label, r in results["quiet"].items()}
        explicit = {label: v for label, v in quiet.items() if label != "default"}
        best = max(explicit, key=explicit.get)
        default_vs_best = quiet["default"] / explicit[best]
        busy_vs_quiet = results["busy"]["default"][b] / quiet["default"]
        out[b] = {
            "best_setting": best,
            "default_vs_best_quiet": default_vs_best,
            "default_busy_vs_quiet": busy_vs_quiet,
            "targets_met": {
                "default_vs_best_quiet": default_vs_best >= 0.9,
                "default_busy_vs_quiet": busy_vs_quiet >= 0.5,
            },
        }
    return out


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    spin_counts = [s for s in args.spin_counts.split(",") if s]
    settings = settings_for(num_cores(), spin_counts)
    if args.only:
        only = args.only.split(",")
        known = {s.label for s in settings}
        unknown = [label for label in only if label not in known]
        if unknown:
            print(
                f"zerolayer bench threads: error: --only: unknown setting {', '.join(unknown)} "
                f"(known with --spin-counts {args.spin_counts!r}: {', '.join(sorted(known))})",
                file=sys.stderr,
            )
            raise SystemExit(2)
        settings = [s for s in settings if s.label in only]
    results: dict = {"quiet": {}, "busy": {}}
    # NOTE: quiet and busy alternate per setting, so a drift of the machine hits both alike.
    for setting in settings:
        for state, rates in measure(args, setting, batch_sizes).items():
            results[state][setting.label] = rates
    document = {
        "model": str(model_dir_for(args)),
        "workload": {
            "batch_sizes": batch_sizes,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "decode_tok_s": "through the four services; tokens arriving while every request "
            "of the batch decodes, per second; median of repeats",
            "busy": "one `python -c 'while True: pass'` process beside the stack",
        },
        "cores": num_cores(),
        "settings": {
            s.label: {"num_threads": s.num_threads, "openmp_env": s.openmp_env} for s in settings
        },
        "decode_tok_s": results,
        "comparison": verdict(results, batch_sizes),
        "targets": {
            "default_vs_best_quiet": ">= 0.9",
            "default_busy_vs_quiet": ">= 0.5",
        },
    }
    plot_bars(
        args.out / "threads.png",
        "Scheduler threads: decode tok/s through the services",
        {
            f"{state}, batch {b}": {label: r[str(b)] for label, r in results[state].items()}
            for b in batch_sizes
            for state in ("quiet", "busy")
        },
    )
    return write_results(args, "threads", document)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    add_batch_sizes_argument(p)
    p.add_argument("--prompt-tokens", type=at_least(1), default=128)
    p.add_argument("--max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--repeats", type=at_least(1), default=2, help="runs per batch size (medians)")
    p.add_argument(
        "--spin-counts",
        type=comma_separated(at_least(0), empty_ok=True),
        default="300000,10000",
        help="GOMP_SPINCOUNT values to try at one thread per core, comma-separated; 300000 is "
        "libgomp's default when no waiting policy is set (default %(default)s; empty: none)",
    )
    p.add_argument(
        "--only",
        default="",
        help="comma-separated labels of the settings to run (default all: 'default', "
        "'N threads', 'N threads spin S')",
    )
