"""Shared pieces of the benchmarks: machine facts, result files, plots, gRPC timing."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from zerolayer.bench.cpu_isa import cpu_facts
from zerolayer.v1 import generation_pb2, generation_pb2_grpc


@dataclass(frozen=True)
class StreamTiming:
    """Client-side timing of one streamed request."""

    ttft_s: float
    """Send to the first message with a token."""
    itl_s: tuple[float, ...]
    """Gaps between consecutive token-carrying messages."""
    e2e_s: float
    """Send to the last message."""
    token_ids: tuple[int, ...]
    cached_prompt_tokens: int
    prompt_tokens: int = 0
    """The prompt's length as the server tokenized (or rendered) it."""
    pinned_prompt_tokens: int = 0
    """Prompt tokens held by the request's pins (``Usage.pinned_prompt_tokens``)."""
    pin_refusal: str = ""
    """Why a pin the request asked for was not made (``Usage.pin_refusal``); empty: none."""


def timed_stream(
    stub: generation_pb2_grpc.TextGenerationStub,
    request: generation_pb2.GenerateRequest,
    timeout_s: float = 600,
) -> StreamTiming:
    """Runs one GenerateStream call and times it (perf_counter, seconds)."""
    start = time.perf_counter()
    arrivals: list[float] = []
    token_ids: list[int] = []
    usage = generation_pb2.Usage()
    for part in stub.GenerateStream(request, timeout=timeout_s):
        if part.token_ids:
            arrivals.append(time.perf_counter())
            token_ids.extend(part.token_ids)
        if part.HasField("usage"):
            usage = part.usage
    end = time.perf_counter()
    gaps = tuple(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return StreamTiming(
        arrivals[0] - start,
        gaps,
        end - start,
        tuple(token_ids),
        usage.cached_prompt_tokens,
        usage.prompt_tokens,
        usage.pinned_prompt_tokens,
        usage.pin_refusal,
    )


def stub_for(address: str) -> generation_pb2_grpc.TextGenerationStub:
    """A stub of the public API at ``address``."""
    return generation_pb2_grpc.TextGenerationStub(grpc.insecure_channel(address))


def machine() -> dict:
    """Facts about this machine for the results file: the CPU, its vector extensions and the
    forced ISA (:func:`zerolayer.bench.cpu_isa.cpu_facts`), cores, Python, torch and its
    threads."""
    import torch

    return {
        **cpu_facts(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def median(values: Sequence[float]) -> float:
    """Median (0.0 for an empty list)."""
    return statistics.median(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation (0.0 for an empty list)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


SMOKE_VERDICT = (
    "not evaluated: --smoke runs the tiny model for seconds to show the scenario works; its "
    "figures say nothing about the targets"
)
"""What a smoke run says in place of each verdict."""


def without_verdicts(results: object) -> object:
    """``results`` with the value of every ``*_met`` key (``targets_met``, ``target_met``,
    ``goals_met``, at any depth) replaced by :data:`SMOKE_VERDICT`. Does not modify ``results``."""
    if isinstance(results, dict):
        return {
            key: SMOKE_VERDICT if key.endswith("_met") else without_verdicts(value)
            for key, value in results.items()
        }
    return results


def write_results(args: argparse.Namespace, scenario: str, results: dict) -> dict:
    """Writes ``<args.out>/<scenario>.json`` with the command line, date and machine, and with
    no verdict on a ``--smoke`` run (:func:`without_verdicts`); returns the document written."""
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "scenario": scenario,
        "command": args.command,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **(without_verdicts(results) if args.smoke else results),  # type: ignore[dict-item]
    }
    (args.out / f"{scenario}.json").write_text(json.dumps(document, indent=2))
    return document


def integer_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Ticks the x axis of matplotlib axes ``ax`` at whole numbers only when every x is an int
    (turns, requests: 1.5 turns is no point of the plot)."""
    if xs and all(isinstance(x, int) for x in xs):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_lines(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
) -> Path:
    """Writes a PNG line plot of named (x, y) series."""
    from zerolayer.bench.plots import save, titled_figure

    fig, [ax] = titled_figure(title, 1, 7)
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    integer_ticks(ax, [x for xs, _ in series.values() for x in xs])
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, path)
