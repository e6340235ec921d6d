"""Multi-turn chat: TTFT of each turn when every turn re-sends the whole history.

zerolayer with prefix caching on, with it off (``--no-prefix-caching``), and Hugging Face
transformers re-prefilling the history in-process (the baseline), in one run, on the same model.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

from zerolayer.bench.common import median, plot_lines, stub_for, timed_stream, write_results
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import generation_pb2 as pb


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


def run_hf(model_dir: Path, w: Workload, vocab_size: int) -> list[list[float]]:
    """TTFT (s) per turn of transformers re-prefilling the history (generate, 1 new token)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    ttfts = []
    with torch.inference_mode():
        for r in range(w.repeats):
            history: list[int] = []
            turn_ttfts = []
            for message in conversation_messages(w, vocab_size, seed=r):
                history += message
                ids = torch.tensor([history])
                start = time.perf_counter()
                model.generate(ids, max_new_tokens=1, do_sample=False)
                turn_ttfts.append(time.perf_counter() - start)
                out = model.generate(
                    ids,
                    max_new_tokens=w.answer_tokens,
                    do_sample=False,
                    min_new_tokens=w.answer_tokens,
                )
                history += out[0, len(history) :].tolist()
            ttfts.append(turn_ttfts)
    return ttfts


def per_turn_medians(runs: list[list[float]]) -> list[float]:
    """Median over repeats of each turn's TTFT."""
    return [median([run[t] for run in runs]) for t in range(len(runs[0]))]


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    import json

    w = Workload(
        num_turns=args.turns,
        message_tokens=args.message_tokens,
        answer_tokens=args.answer_tokens,
        repeats=args.repeats,
    )
    model_dir = Path(args.model) if args.model else ensure_dummy_model(args.preset)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    systems: dict[str, list[float]] = {}
    for name, caching in (("zerolayer_prefix_caching", True), ("zerolayer_no_caching", False)):
        config = StackConfig(
            model_dir=str(model_dir),
            listen=f"127.0.0.1:{args.port}",
            enable_prefix_caching=caching,
            log_dir=str(args.out / "logs"),
            kv_cache_bytes=args.kv_cache_bytes,
        )
        with Stack(config):
            run_zerolayer(config.listen, Workload(1, w.message_tokens, 2, 1), vocab_size)  # warm
            systems[name] = per_turn_medians(run_zerolayer(config.listen, w, vocab_size))
    systems["hf_transformers"] = per_turn_medians(run_hf(model_dir, w, vocab_size))
    ratios = {name: ttft[-1] / ttft[0] for name, ttft in systems.items()}
    results = {
        "model": str(model_dir),
        "workload": w.__dict__,
        "ttft_s_per_turn": systems,
        "turn_last_over_turn_first": ratios,
        "last_turn_ttft_vs_hf": systems["zerolayer_prefix_caching"][-1]
        / systems["hf_transformers"][-1],
        "target": f"turn-{w.num_turns} (last) TTFT / turn-1 TTFT <= 1.5 with prefix caching",
        "target_met": ratios["zerolayer_prefix_caching"] <= 1.5,
    }
    turns = list(range(1, w.num_turns + 1))
    plot_lines(
        args.out / "multiturn.png",
        "Multi-turn TTFT (whole history re-sent each turn)",
        "turn",
        "TTFT (s)",
        {name: (turns, ttft) for name, ttft in systems.items()},
    )
    write_results(args.out, "multiturn", args.command, results)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--message-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
