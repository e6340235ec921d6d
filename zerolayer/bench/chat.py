"""Chat: multi-turn conversations sent as messages, rendered with the model's chat template.

zerolayer renders each request's messages with the template of the model's tokenizer_config.json
(``GenerateRequest.messages``); the baseline, Hugging Face transformers, renders the same messages
with ``apply_chat_template`` and runs ``generate`` in-process. Both see the same conversations
(fixed assistant answers in the history, so the prompts are identical), and the run checks that
both rendered every prompt to the same number of tokens. The dummy presets have no chat template:
the scenario gives a copy of the model ChatML's (the template of SmolLM2 and Qwen2.5).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from zerolayer.bench.common import median, plot_lines, stub_for, timed_stream, write_results
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import generation_pb2 as pb

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as SmolLM2's and Qwen2.5's templates render a conversation without tools."""

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
    """A copy of ``model_dir`` (weights hard-linked where possible) whose tokenizer_config.json
    has :data:`CHATML_TEMPLATE` unless it already has a chat template."""
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    if config.get("chat_template") or (model_dir / "chat_template.jinja").exists():
        return model_dir
    target = out / f"{model_dir.name}-chatml"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in model_dir.iterdir():
        try:
            os.link(path, target / path.name)
        except OSError:
            shutil.copy2(path, target / path.name)
    (target / "tokenizer_config.json").unlink()
    config["chat_template"] = CHATML_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
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


def run_hf(model_dir: Path, w: Workload) -> list[list[TurnTiming]]:
    """Timings of transformers rendering with ``apply_chat_template`` and running ``generate``
    (one new token for the TTFT, then the whole answer)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    runs = []
    with torch.inference_mode():
        for c in range(w.conversations):
            messages = conversation(w, seed=c)
            turns = []
            for t in range(w.num_turns):
                start = time.perf_counter()
                ids = tokenizer.apply_chat_template(
                    turn_messages(messages, t), add_generation_prompt=True, return_tensors="pt"
                )
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                model.generate(ids, max_new_tokens=1, do_sample=False)
                ttft = time.perf_counter() - start
                start = time.perf_counter()
                ids = tokenizer.apply_chat_template(
                    turn_messages(messages, t), add_generation_prompt=True, return_tensors="pt"
                )
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                model.generate(
                    ids,
                    max_new_tokens=w.answer_tokens,
                    min_new_tokens=w.answer_tokens,
                    do_sample=False,
                )
                turns.append(TurnTiming(ttft, time.perf_counter() - start, ids.shape[-1]))
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
    w = Workload(
        num_turns=args.turns,
        conversations=args.conversations,
        message_words=args.message_words,
        answer_tokens=args.answer_tokens,
    )
    base = Path(args.model) if args.model else ensure_dummy_model(args.preset)
    model_dir = chat_model_dir(base, args.out)
    config = StackConfig(
        model_dir=str(model_dir),
        listen=f"127.0.0.1:{args.port}",
        log_dir=str(args.out / "logs"),
        kv_cache_bytes=args.kv_cache_bytes,
    )
    with Stack(config):
        run_zerolayer(config.listen, Workload(1, 1, 4, 2))  # warm
        zl_runs = run_zerolayer(config.listen, w)
    hf_runs = run_hf(model_dir, w)
    zl_lengths = [t.prompt_tokens for run in zl_runs for t in run]
    hf_lengths = [t.prompt_tokens for run in hf_runs for t in run]
    systems = {"zerolayer": summarize(zl_runs, w), "hf_transformers": summarize(hf_runs, w)}
    results = {
        "model": str(model_dir),
        "workload": w.__dict__,
        "systems": systems,
        "same_prompt_lengths": zl_lengths == hf_lengths,
        "prompt_tokens": zl_lengths,
        "output_tok_s_vs_hf": systems["zerolayer"]["output_tokens_per_s"]
        / systems["hf_transformers"]["output_tokens_per_s"],
        "last_turn_ttft_vs_hf": systems["zerolayer"]["ttft_s_per_turn"][-1]
        / systems["hf_transformers"]["ttft_s_per_turn"][-1],
    }
    turns = list(range(1, w.num_turns + 1))
    plot_lines(
        args.out / "chat.png",
        "Chat: TTFT per turn (messages rendered with the model's template)",
        "turn",
        "TTFT (s)",
        {name: (turns, s["ttft_s_per_turn"]) for name, s in systems.items()},
    )
    write_results(args.out, "chat", args.command, results)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    p.add_argument("--turns", type=int, default=4, help="user turns per conversation")
    p.add_argument("--conversations", type=int, default=3, help="conversations per system")
    p.add_argument("--message-words", type=int, default=48, help="words per message")
    p.add_argument("--answer-tokens", type=int, default=32, help="tokens generated per turn")
