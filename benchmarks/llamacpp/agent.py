"""The baseline of ``zerolayer bench agent``: llama.cpp's ``llama-server`` on the same sessions and
background, with its prompt cache (``cache_prompt``).

The server runs the checkpoint's weights as GGUF (F32 for a float32 checkpoint, else BF16: the
same numbers) with one slot per stream that can be in flight at once (every session and every
background stream), so no request waits for a slot and a session finds its own slot again unless
a background request took it while the session's tool ran (llama-server hands an idle slot to a
prompt that shares most of its prefix, else to the least recently used one). Its host-memory
prompt cache (``--cache-ram``, where a taken slot's prompt is saved and restored from) holds the
tokens of zerolayer's KV pool that the slots do not (slots and cache together: as many tokens as
zerolayer's pool, at llama.cpp's F16) unless ``--llama-cache-ram-mib`` says otherwise. Each turn
is a streamed request for one token (its TTFT and ``timings.cache_n``) and the same prompt again,
not streamed, for the answer's ids (:meth:`LlamaServer.greedy_ids` says why). Skipped with a
line when the ``gguf`` package or the binary is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

from benchmarks.llamacpp.baselines import free_port, server_skip_reason
from benchmarks.llamacpp.server import LlamaServer, LlamaServerConfig, find_llama_server
from zerolayer.bench.agent import arm_results
from zerolayer.bench.agent_sessions import AgentWorkload, Background, TurnRecord, run_sessions
from zerolayer.bench.checkout import Comparison
from zerolayer.bench.streams import num_cores

SYSTEM = "llama.cpp's llama-server (cache_prompt)"
"""Whom the scenario is compared with (its line in ``zerolayer bench --help``)."""
REQUIREMENTS: tuple[str, ...] = ()
"""None to start: without gguf or the binary the llama-server arm is skipped with a line."""
SMOKE: dict = {}
LLAMA_KV_ITEMSIZE = 2
"""Bytes of an element of llama.cpp's KV cache: F16, its default ``--cache-type-k/-v``."""
ARM = "llama_server_cache_prompt"
"""The arm's name in the results."""


def skip_reason(binary: Path | None) -> str | None:
    """Why the arm cannot run here (None: it can)."""
    if importlib.util.find_spec("gguf") is None:
        return "gguf not installed: .venv/bin/pip install -e '.[bench]'"
    return server_skip_reason(binary)


def server_config(
    args: argparse.Namespace, binary: Path, model_dir: Path, w: AgentWorkload, sizes: dict
) -> LlamaServerConfig:
    """llama-server on the checkpoint's GGUF, a slot per concurrent stream, each as long as a
    session, one thread per core; ``--cache-ram`` as zerolayer's pool (or the flag)."""
    from benchmarks.llamacpp.gguf_export import ensure_gguf

    config = json.loads((model_dir / "config.json").read_text())
    gguf_type = "f32" if config.get("torch_dtype", "float32") == "float32" else "bf16"
    num_slots = w.num_sessions + w.background_streams
    slot_tokens = max(w.session_tokens, w.background_prompt_tokens + w.background_answer_tokens)
    cache_ram_mib = args.llama_cache_ram_mib
    if cache_ram_mib is None:
        cache_tokens = max(0, sizes["tokens"] - num_slots * slot_tokens)
        cache_ram_mib = math.ceil(cache_tokens * kv_bytes_per_token(config) / (1 << 20))
    return LlamaServerConfig(
        binary,
        ensure_gguf(model_dir, args.out / "gguf", gguf_type),
        free_port(),
        num_cores(),
        num_slots,
        slot_tokens,
        args.out / "logs" / "llama-server-agent.log",
        cache_ram_mib=cache_ram_mib,
    )


def kv_bytes_per_token(config: dict) -> int:
    """Bytes of one token's K and V in llama.cpp's KV cache (its default type, F16), from a Hugging
    Face ``config.json``."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (
        2
        * config["num_hidden_layers"]
        * config["num_key_value_heads"]
        * head_dim
        * LLAMA_KV_ITEMSIZE
    )


def run_llama(config: LlamaServerConfig, w: AgentWorkload, vocab_size: int, sizes: dict) -> dict:
    """The sessions and background against the server: the same results as a zerolayer arm."""
    with LlamaServer(config) as server:
        server.complete([1, 3, 4, 5], 2, cache_prompt=False)  # warm-up

        def send_turn(session: int, prompt: list[int]) -> TurnRecord:
            # NOTE: the stream's events lose the ids of tokens held back inside a UTF-8
            # character, so the answer's ids come from the same prompt again, not streamed: the
            # slot now holds it, and the slot ends as one request would leave it.
            c = server.complete(prompt, 1, cache_prompt=True)
            answer = server.greedy_ids(prompt, w.answer_tokens, cache_prompt=True)
            return TurnRecord(c.times.ttft_s, answer, len(prompt), c.cached_tokens)

        def send_background(prompt: list[int]) -> None:
            server.complete(prompt, w.background_answer_tokens, cache_prompt=True)

        gap_tokens = math.ceil(w.gap_pool_fills * sizes["tokens"])
        with Background(send_background, w, vocab_size) as background:
            sessions = run_sessions(send_turn, background, w, vocab_size, gap_tokens)
    return arm_results(sessions, background.num_tokens, sizes["tokens"])


def compare(args: argparse.Namespace, model_dir: Path, w: AgentWorkload, sizes: dict) -> Comparison:
    """The llama-server arm, or why it was skipped (one line on stderr)."""
    binary = find_llama_server(args.llama_server)
    reason = skip_reason(binary)
    if reason:
        print(f"zerolayer bench agent: llama-server skipped: {reason}", file=sys.stderr)
        return Comparison({"llama_server": {"skipped": reason}})
    assert binary is not None
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    config = server_config(args, binary, model_dir, w, sizes)
    arm = run_llama(config, w, vocab_size, sizes)
    return Comparison(
        {
            "arms": {ARM: arm},
            "llama_server": {
                "argv": config.argv(),
                "slots": config.num_slots,
                "slots_why": "one per stream that can be in flight at once (every session and "
                "every background stream): no request waits for a slot",
                "slot_tokens": config.max_seq_tokens,
                "cache_ram_mib": config.cache_ram_mib,
                "cache_ram_why": "--llama-cache-ram-mib"
                if args.llama_cache_ram_mib is not None
                else "the slots and the prompt cache hold as many tokens as zerolayer's KV pool "
                "(F16 KV, llama.cpp's default)",
            },
        }
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The binary and its prompt cache's size."""
    p.add_argument(
        "--llama-server",
        help="llama-server binary (default: on PATH, else where scripts/build_llama_server.sh "
        "puts it)",
    )
    p.add_argument(
        "--llama-cache-ram-mib",
        type=int,
        default=None,
        help="llama-server --cache-ram, MiB (default: the tokens of zerolayer's KV pool that its "
        "slots do not hold, at F16; 0 disables its prompt cache)",
    )
