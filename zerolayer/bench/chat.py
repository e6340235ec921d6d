"""Chat: multi-turn conversations sent as messages, rendered with the model's chat template.

zerolayer renders each request's messages with the model's chat template
(``GenerateRequest.messages``). From a checkout, the baseline, Hugging Face transformers, renders
the same messages with ``apply_chat_template`` and runs ``generate`` in-process
(``benchmarks/hf/chat.py``): both see the same conversations (fixed assistant answers in the
history, so the prompts are identical), and the run checks that both rendered every prompt to the
same number of tokens. A model without a chat template (the dummy presets) is served from a copy
that has ChatML (:data:`zerolayer.checkpoints.chat_templates.CHATML`, ``make-dummy
--chat-template chatml``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from zerolayer.bench.checkout import baseline_for, compared
from zerolayer.bench.common import median, plot_lines, stub_for, timed_stream, write_results
from zerolayer.bench.scenario import model_dir_for, stack_config
from zerolayer.checkpoints.chat_templates import TEMPLATE_FILE, write_chat_template
from zerolayer.cli.arg_types import at_least
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb

HELP = "chat conversations sent as messages, rendered with the model's template: TTFT per turn"
"""The scenario's line in ``zerolayer bench --help``."""

WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away")

SMOKE = {"turns": 2, "conversations": 1, "answer_tokens": 4, "message_words": 8}
"""What ``--smoke`` changes."""


@dataclass(frozen=True)
class Workload:
    """The conversations' shape."""

    num_turns: int = 4
    conversations: int = 3
    """Conversations per system (each under its own cache salt); medians are reported."""
    message_words: int = 48
    """Words per user message and per assistant answer in the history."""
    answer_tokens: int = 32
    """Tokens generated per turn (end-of-sequence ignored)."""


def conversation(w: Workload, seed: int) -> list[dict[str, str]]:
    """A system message, then ``num_turns`` user messages each followed by an assistant answer
    (the last answer is what each system generates; the others are fixed text)."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(w.message_words))

    messages = [{"role": "system", "content": "You are a storyteller."}]
    for _ in range(w.num_turns):
        messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
    return messages


def turn_messages(messages: list[dict[str, str]], turn: int) -> list[dict[str, str]]:
    """The messages sent at ``turn`` (0-based): the history up to that turn's user message."""
    return messages[: 2 + 2 * turn]


def chat_model_dir(model_dir: Path, out: Path) -> Path:
    """``model_dir`` when it has a chat template; else a copy of it (files hard-linked where
    possible) with ChatML as its chat_template.jinja."""
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    if config.get("chat_template") or (model_dir / TEMPLATE_FILE).exists():
        return model_dir
    target = out / f"{model_dir.name}-chatml"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in model_dir.iterdir():
        try:
            os.link(path, target / path.name)
        except OSError:
            shutil.copy2(path, target / path.name)
    write_chat_template(target, "chatml")
    return target


@dataclass(frozen=True)
class TurnTiming:
    """One request: time to first token, whole request, prompt length as rendered."""

    ttft_s: float
    e2e_s: float
    prompt_tokens: int


def run_zerolayer(address: str, w: Workload) -> list[list[TurnTiming]]:
    """Timings per conversation and turn, over gRPC streaming with ``messages``."""
    stub = stub_for(address)
    runs = []
    for c in range(w.conversations):
        messages = conversation(w, seed=c)
        turns = []
        for t in range(w.num_turns):
            sent = turn_messages(messages, t)
            chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in sent]
            request = pb.GenerateRequest(
                messages=pb.ChatMessages(messages=chat),
                max_new_tokens=w.answer_tokens,
                ignore_eos=True,
                cache_salt=f"bench-chat-{c}",
            )
            timing = timed_stream(stub, request)
            turns.append(TurnTiming(timing.ttft_s, timing.e2e_s, timing.prompt_tokens))
        runs.append(turns)
    return runs


def summarize(runs: list[list[TurnTiming]], w: Workload) -> dict:
    """Median TTFT per turn, median request time, output tokens per second of request time."""
    turns = range(w.num_turns)
    e2e = [timing.e2e_s for run in runs for timing in run]
    return {
        "ttft_s_per_turn": [median([run[t].ttft_s for run in runs]) for t in turns],
        "e2e_s_median": median(e2e),
        "output_tokens_per_s": w.answer_tokens * len(e2e) / sum(e2e),
    }


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    baseline = baseline_for("chat")
    w = Workload(
        num_turns=args.turns,
        conversations=args.conversations,
        message_words=args.message_words,
        answer_tokens=args.answer_tokens,
    )
    model_dir = chat_model_dir(model_dir_for(args), args.out)
    # NOTE: num_threads 0, the scheduler's default: the scenario has no --num-threads
    config = stack_config(args, model_dir, num_threads=0)
    with Stack(config):
        run_zerolayer(config.listen, Workload(1, 1, 4, 2))  # warm
        zl_runs = run_zerolayer(config.listen, w)
    comparison = baseline.compare(args, model_dir, w, zl_runs) if baseline else None
    systems = {"zerolayer": summarize(zl_runs, w)}
    results = {
        "model": str(model_dir),
        "workload": w.__dict__,
        "systems": systems,
        "prompt_tokens": [t.prompt_tokens for run in zl_runs for t in run],
    }
    turns = list(range(1, w.num_turns + 1))
    plot_lines(
        args.out / "chat.png",
        "Chat: TTFT per turn (messages rendered with the model's template)",
        "turn",
        "TTFT (s)",
        {
            **{name: (turns, s["ttft_s_per_turn"]) for name, s in systems.items()},
            **(comparison.plot if comparison else {}),
        },
    )
    return write_results(args, "chat", compared(results, comparison))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--turns", type=at_least(1), default=4, help="user turns per conversation")
    p.add_argument("--conversations", type=at_least(1), default=3, help="conversations per system")
    p.add_argument("--message-words", type=at_least(1), default=48, help="words per message")
    p.add_argument(
        "--answer-tokens", type=at_least(1), default=32, help="tokens generated per turn"
    )
