"""Multi-turn chat: TTFT of each turn when every turn re-sends the whole history.

zerolayer with prefix caching on and with it off (``--no-prefix-caching``), in one run, on the same
model; from a checkout also Hugging Face transformers re-prefilling the history in-process (the
baseline, ``benchmarks/hf/multiturn.py``).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from zerolayer.bench.checkout import baseline_for, compared
from zerolayer.bench.common import median, plot_lines, stub_for, timed_stream, write_results
from zerolayer.bench.scenario import model_dir_for, stack_config, vocab_size_of
from zerolayer.cli.arg_types import at_least
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb

HELP = "TTFT of each turn when every turn re-sends the whole history"
"""The scenario's line in ``zerolayer bench --help``."""
SMOKE = {"turns": 2, "repeats": 1, "message_tokens": 8, "answer_tokens": 4}
"""Overrides of ``--smoke``."""


@dataclass(frozen=True)
class Workload:
    """The conversation's shape."""

    num_turns: int = 8
    message_tokens: int = 64
    """New user tokens per turn."""
    answer_tokens: int = 32
    """Generated tokens per turn."""
    repeats: int = 3
    """Conversations per system (each under its own cache salt); medians are reported."""


def conversation_messages(w: Workload, vocab_size: int, seed: int) -> list[list[int]]:
    """The user messages of one conversation (token ids; the first starts with BOS)."""
    rng = random.Random(seed)
    messages = [
        [rng.randrange(3, min(vocab_size, 259)) for _ in range(w.message_tokens)]
        for _ in range(w.num_turns)
    ]
    messages[0] = [1, *messages[0][1:]]
    return messages


def run_zerolayer(address: str, w: Workload, vocab_size: int) -> list[list[float]]:
    """TTFT (s) per turn for each repeat, over gRPC streaming."""
    stub = stub_for(address)
    ttfts = []
    for r in range(w.repeats):
        history: list[int] = []
        turn_ttfts = []
        for message in conversation_messages(w, vocab_size, seed=r):
            history += message
            request = pb.GenerateRequest(
                prompt_token_ids=pb.TokenIds(ids=history),
                max_new_tokens=w.answer_tokens,
                ignore_eos=True,
                cache_salt=f"bench-{r}",
            )
            timing = timed_stream(stub, request)
            turn_ttfts.append(timing.ttft_s)
            history += list(timing.token_ids)
        ttfts.append(turn_ttfts)
    return ttfts


def per_turn_medians(runs: list[list[float]]) -> list[float]:
    """Median over repeats of each turn's TTFT."""
    return [median([run[t] for run in runs]) for t in range(len(runs[0]))]


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    baseline = baseline_for("multiturn")
    w = Workload(
        num_turns=args.turns,
        message_tokens=args.message_tokens,
        answer_tokens=args.answer_tokens,
        repeats=args.repeats,
    )
    model_dir = model_dir_for(args)
    vocab_size = vocab_size_of(model_dir)
    systems: dict[str, list[float]] = {}
    for name, caching in (("zerolayer_prefix_caching", True), ("zerolayer_no_caching", False)):
        # NOTE: num_threads 0, the scheduler's default: the scenario has no --num-threads
        config = stack_config(args, model_dir, num_threads=0, enable_prefix_caching=caching)
        with Stack(config):
            run_zerolayer(config.listen, Workload(1, w.message_tokens, 2, 1), vocab_size)  # warm
            systems[name] = per_turn_medians(run_zerolayer(config.listen, w, vocab_size))
    comparison = (
        baseline.compare(args, model_dir, w, vocab_size, systems["zerolayer_prefix_caching"])
        if baseline
        else None
    )
    ratios = {name: ttft[-1] / ttft[0] for name, ttft in systems.items()}
    results = {
        "model": str(model_dir),
        "workload": w.__dict__,
        "ttft_s_per_turn": systems,
        "turn_last_over_turn_first": ratios,
        "target": f"turn-{w.num_turns} (last) TTFT / turn-1 TTFT <= 1.5 with prefix caching",
        "target_met": ratios["zerolayer_prefix_caching"] <= 1.5,
    }
    turns = list(range(1, w.num_turns + 1))
    plot_lines(
        args.out / "multiturn.png",
        "Multi-turn TTFT (whole history re-sent each turn)",
        "turn",
        "TTFT (s)",
        {
            **{name: (turns, ttft) for name, ttft in systems.items()},
            **(comparison.plot if comparison else {}),
        },
    )
    return write_results(args, "multiturn", compared(results, comparison))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--turns", type=at_least(1), default=8)
    p.add_argument("--message-tokens", type=at_least(1), default=64)
    p.add_argument("--answer-tokens", type=at_least(1), default=32)
    p.add_argument("--repeats", type=at_least(1), default=3)
