"""Agent sessions: TTFT, prefilled and cached tokens and KVR per turn, with and without pins.

Concurrent agent sessions (a long system prompt with tools, then turns of tool calls and tool
results: :mod:`zerolayer.bench.agent_sessions`) beside background traffic that fills the KV pool
several times over. zerolayer runs twice on the same stack settings: each session's requests
carrying a pin of its context (``cache_pins``: key the session, one hour, output included, so the
next turn finds prompt and answer), and without. The pool is ``--kv-pool-multiple`` times the
sessions' total context, so LRU eviction really happens. From a checkout also llama.cpp's
``llama-server`` on the same sessions with ``cache_prompt`` (``benchmarks/llamacpp/agent.py``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from zerolayer.bench.agent_sessions import (
    AgentWorkload,
    Background,
    TurnRecord,
    per_turn,
    run_sessions,
    verdicts,
)
from zerolayer.bench.checkout import baseline_for, compared
from zerolayer.bench.common import plot_lines, stub_for, timed_stream, write_results
from zerolayer.bench.scenario import stack_config, vocab_size_of, warm_up
from zerolayer.bench.streams import generate_request, stream_token_times
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import PRESETS, ensure_dummy_model
from zerolayer.cli.arg_types import at_least, positive
from zerolayer.common import settings
from zerolayer.kv.arena_layout import model_arena_layout
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb

HELP = "agent sessions beside background traffic: KVR and TTFT per turn, with and without pins"
"""The scenario's line in ``zerolayer bench --help``."""
PRESET = "tiny"
"""The default ``--preset``: tiny is what 2 cores run in minutes at these context lengths."""
KV_CACHE_BYTES = None
"""No default ``--kv-cache-bytes``: the pool is sized by ``--kv-pool-multiple``."""
SMOKE = {
    "sessions": 2,
    "system_tokens": 64,
    "turns": 3,
    "answer_tokens": 4,
    "tool_result_tokens": 16,
    "background_prompt_tokens": 32,
}
"""Overrides of ``--smoke``."""
PIN_TTL_S = 3600
"""Each session's pin lasts an hour (longer than any run)."""
BLOCK_SIZE = settings.BLOCK_SIZE.default
"""The stack's ``--block-size`` (its default), for sizing the pool."""


def workload(args: argparse.Namespace) -> AgentWorkload:
    """The workload of the flags."""
    return AgentWorkload(
        num_sessions=args.sessions,
        system_tokens=args.system_tokens,
        num_turns=args.turns,
        answer_tokens=args.answer_tokens,
        tool_result_tokens=args.tool_result_tokens,
        background_streams=args.background_streams,
        background_prompt_tokens=args.background_prompt_tokens,
        gap_pool_fills=args.gap_pool_fills,
    )


def model_dir_of(args: argparse.Namespace, w: AgentWorkload) -> Path:
    """``--model``, or ``--preset``'s dummy with a context of the longest session (rounded up to a
    power of two, at least the preset's own: the same weights, RoPE has no learned positions)."""
    if args.model:
        return Path(args.model)
    preset = PRESETS[args.preset].max_position_embeddings
    context = max(preset, 1 << math.ceil(math.log2(w.session_tokens)))
    return ensure_dummy_model(args.preset, max_position_embeddings=context)


def pool(args: argparse.Namespace, model_dir: Path, w: AgentWorkload) -> dict:
    """The KV pool: ``--kv-cache-bytes``, or ``--kv-pool-multiple`` times the sessions' total
    context (whole blocks); its size in bytes and tokens."""
    layout = model_arena_layout(read_checkpoint(model_dir), BLOCK_SIZE, 0)
    if args.kv_cache_bytes:
        num_blocks = args.kv_cache_bytes // layout.block_bytes
    else:
        num_blocks = math.ceil(args.kv_pool_multiple * w.sessions_tokens / BLOCK_SIZE)
    return {
        "kv_cache_bytes": num_blocks * layout.block_bytes,
        "tokens": num_blocks * BLOCK_SIZE,
        "sessions_context_tokens": w.sessions_tokens,
        "pool_over_sessions_context": num_blocks * BLOCK_SIZE / w.sessions_tokens,
    }


def turn_request(
    w: AgentWorkload, session: int, prompt: list[int], pins: bool
) -> pb.GenerateRequest:
    """Session ``session``'s greedy request for its answer, under its own cache salt; with
    ``pins``, pinning its context with the output (key: the session)."""
    request = generate_request(prompt, w.answer_tokens)
    request.cache_salt = f"agent-session-{session}"
    if pins:
        request.cache_pins.append(
            pb.CachePin(ttl_s=PIN_TTL_S, key=f"session-{session}", include_output=True)
        )
    return request


def run_arm(
    args: argparse.Namespace, model_dir: Path, w: AgentWorkload, sizes: dict, pins: bool
) -> dict:
    """One zerolayer arm on a fresh stack: per-turn medians, the background's volume and the
    verdicts."""
    vocab_size = vocab_size_of(model_dir)
    config = stack_config(args, model_dir, num_threads=0, kv_cache_bytes=sizes["kv_cache_bytes"])
    with Stack(config):
        warm_up(config.listen, vocab_size)
        stub = stub_for(config.listen)

        def send_turn(session: int, prompt: list[int]) -> TurnRecord:
            t = timed_stream(stub, turn_request(w, session, prompt, pins))
            return TurnRecord(
                t.ttft_s, t.token_ids, t.prompt_tokens, t.cached_prompt_tokens, 0, t.pin_refusal
            )

        def send_background(prompt: list[int]) -> None:
            stream_token_times(stub, generate_request(prompt, w.background_answer_tokens))

        gap_tokens = math.ceil(w.gap_pool_fills * sizes["tokens"])
        with Background(send_background, w, vocab_size) as background:
            sessions = run_sessions(send_turn, background, w, vocab_size, gap_tokens)
        return arm_results(sessions, background.num_tokens, sizes["tokens"])


def arm_results(sessions: list[list[TurnRecord]], background_tokens: int, pool_tokens: int) -> dict:
    """An arm's results document: per-turn medians, the verdicts, the background's volume."""
    turns = per_turn(sessions)
    return {
        "per_turn": turns,
        **verdicts(turns),
        "background_prompt_tokens": background_tokens,
        "background_pool_fills": background_tokens / pool_tokens,
    }


def main(args: argparse.Namespace) -> dict:
    """Runs the scenario; returns the results document."""
    w = workload(args)
    model_dir = model_dir_of(args, w)
    sizes = pool(args, model_dir, w)
    arms = {
        "zerolayer_pins": run_arm(args, model_dir, w, sizes, pins=True),
        "zerolayer_no_pins": run_arm(args, model_dir, w, sizes, pins=False),
    }
    baseline = baseline_for("agent")
    comparison = baseline.compare(args, model_dir, w, sizes) if baseline else None
    results = {
        "model": str(model_dir),
        "workload": {
            **w.__dict__,
            "session_tokens": w.session_tokens,
            "system_prompts": "distinct per session (each its own cache salt)",
            "greedy": True,
            "ignore_eos": True,
        },
        "kv_pool": sizes,
        "kvr": "cached prompt tokens / prompt tokens an earlier turn of the session already had "
        "(prompt - this turn's tool result)",
        "targets": "with pins: KVR >= 0.9 on every turn from turn 2 (lowest median over "
        "sessions), last turn's TTFT <= 1.2x turn 2's (medians over sessions)",
        "arms": arms,
    }
    results = compared(results, comparison)
    turns = list(range(1, w.num_turns + 1))
    plot_lines(
        args.out / "agent.png",
        "Agent sessions beside background traffic: TTFT per turn (median over sessions)",
        "turn",
        "TTFT (s)",
        {name: (turns, arm["per_turn"]["ttft_s"]) for name, arm in results["arms"].items()},
    )
    return write_results(args, "agent", results)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the scenario."""
    d = AgentWorkload()
    p.add_argument("--sessions", type=at_least(1), default=d.num_sessions)
    p.add_argument(
        "--system-tokens",
        type=at_least(2),
        default=d.system_tokens,
        help="system prompt with tools per session, distinct per session (default %(default)s)",
    )
    p.add_argument("--turns", type=at_least(2), default=d.num_turns)
    p.add_argument("--answer-tokens", type=at_least(1), default=d.answer_tokens)
    p.add_argument("--tool-result-tokens", type=at_least(1), default=d.tool_result_tokens)
    p.add_argument("--background-streams", type=at_least(1), default=d.background_streams)
    p.add_argument(
        "--background-prompt-tokens", type=at_least(1), default=d.background_prompt_tokens
    )
    p.add_argument(
        "--gap-pool-fills",
        type=positive,
        default=d.gap_pool_fills,
        help="background prompt tokens between two turns of a session, in KV pools "
        "(default %(default)s)",
    )
    p.add_argument(
        "--kv-pool-multiple",
        type=positive,
        default=3.0,
        help="the KV pool, in multiples of the sessions' total context, unless --kv-cache-bytes "
        "(default %(default)s)",
    )
