"""The llama.cpp side of ``zerolayer bench llamacpp``: GGUF files, the exactness check, the
in-process models and the ``llama-server`` processes, or why each is skipped here."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from benchmarks.llamacpp.gguf_export import ensure_gguf
from benchmarks.llamacpp.server import LlamaServer, LlamaServerConfig, find_llama_server
from benchmarks.llamacpp.systems import LlamaCppSystem
from zerolayer.bench.streams import random_prompts

LLAMA_EXTRA = "pip install 'zerolayer[bench]' (from a clone: .venv/bin/pip install -e '.[bench]')"


def llama_skip_reason() -> str | None:
    """Why the in-process llama.cpp side cannot run here (None: it can)."""
    missing = [m for m in ("llama_cpp", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: {LLAMA_EXTRA}"
    return None


def server_skip_reason(binary: Path | None) -> str | None:
    """Why the llama-server side cannot run (None: it can)."""
    if binary is None:
        return "llama-server not found (scripts/build_llama_server.sh, or --llama-server PATH)"
    if not binary.exists():
        return f"--llama-server {binary} does not exist"
    return None


def skipped(what: str, reason: str) -> dict:
    """Prints that ``what`` is skipped (stderr, so CI logs show it) and returns the record."""
    print(f"zerolayer bench llamacpp: {what} skipped: {reason}", file=sys.stderr)
    return {"skipped": reason}


def free_port() -> int:
    """A TCP port nothing listens on now (for llama-server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repacking_works(gguf_path: Path, num_threads: int) -> bool:
    """Whether llama.cpp survives two greedy tokens of ``gguf_path`` with its default weight
    repacking, tried in a child process.

    NOTE: on a VM that lists AMX among the CPU's flags and grants the process its tile state but
    whose tile loads still fault (seen here: SIGILL in ggml's AMX matmul of Q8_0 weights), a
    native build of llama.cpp dies on any quantized model; without repacking it runs.
    """
    code = (
        "import sys; from pathlib import Path; "
        "from benchmarks.llamacpp.engine import LlamaCppConfig, LlamaCppModel; "
        "config = LlamaCppConfig(int(sys.argv[2]), 1, 16); "
        "LlamaCppModel(Path(sys.argv[1]), config).greedy([[3, 4]], 2)"
    )
    argv = [sys.executable, "-c", code, str(gguf_path), str(num_threads)]
    proc = subprocess.run(argv, capture_output=True, timeout=300)
    return proc.returncode == 0


def open_llama_systems(
    model_dir: Path,
    gguf_types: list[str],
    num_threads: int,
    repack: bool,
    args: argparse.Namespace,
) -> tuple[dict, list[LlamaCppSystem]]:
    """The GGUF files (exported once under ``<out>/gguf``) and a system per weight type."""
    from benchmarks.llamacpp.engine import LlamaCppConfig, LlamaCppModel

    paths = {t: ensure_gguf(model_dir, args.out / "gguf", t) for t in gguf_types}
    longest = max(
        args.decode_prompt_tokens + args.decode_tokens,
        args.ttft_prompt_tokens + 1,
        args.batch_prompt_tokens + args.batch_max_new_tokens,
    )
    systems = []
    for t, path in paths.items():
        single = LlamaCppModel(
            path, LlamaCppConfig(num_threads, 1, longest, extra_buffer_types=repack)
        )
        batched = LlamaCppModel(
            path,
            LlamaCppConfig(num_threads, args.batch_requests, longest, extra_buffer_types=repack),
        )
        systems.append(LlamaCppSystem(f"llama.cpp {t.upper()}", single, batched))
    return paths, systems


def llama_system_info() -> dict[str, str]:
    """Which llama.cpp library runs in process (``$LLAMA_CPP_LIB_PATH``, else llama-cpp-python's
    own) and the instruction sets it was built for (``llama_print_system_info``): its figures
    name their ISA as zerolayer's do (an AVX2-only build measures what an AVX2 host runs)."""
    import llama_cpp

    return {
        "library": os.environ.get("LLAMA_CPP_LIB_PATH") or "llama-cpp-python's own",
        "features": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }


def exactness(
    model_dir: Path, vocab_size: int, num_threads: int, repack: bool, args: argparse.Namespace
) -> dict:
    """:func:`benchmarks.llamacpp.gguf_exactness.gguf_agreement` of F32, BF16 and Q8_0 GGUFs."""
    from benchmarks.llamacpp.gguf_exactness import EXACTNESS_PROMPT_SEED, gguf_agreement

    paths = {t: ensure_gguf(model_dir, args.out / "gguf", t) for t in ("f32", "bf16", "q8_0")}
    prompt = random_prompts(1, 32, vocab_size, EXACTNESS_PROMPT_SEED)[0]
    return gguf_agreement(model_dir, paths, prompt, args.exactness_tokens, num_threads, repack)


def start_llama(
    model_dir: Path,
    gguf_types: list[str],
    num_threads: int,
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
) -> tuple[dict, list[LlamaCppSystem], dict[str, LlamaServer]]:
    """The checked GGUF files, a system per weight type and a running llama-server per weight
    type, each closed by ``stack``; what cannot run here is skipped with a message on stderr.

    Returns:
        The record for the results file, the in-process systems, the servers by name.
    """
    llama: dict = {"gguf_types": gguf_types}
    reason = llama_skip_reason()
    if reason:
        llama["exactness"] = skipped("llama.cpp (in process and llama-server)", reason)
        return llama, [], {}
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    llama["system_info"] = llama_system_info()
    repack = all(
        repacking_works(ensure_gguf(model_dir, args.out / "gguf", t), num_threads)
        for t in sorted({*gguf_types, "q8_0"})
    )
    llama["weight_repacking"] = repack
    if not repack:
        llama["weight_repacking_note"] = (
            "llama.cpp's default weight repacking (AMX here) crashed in a child process on this "
            "machine: measured without it (use_extra_bufts=false, llama-server --no-repack)"
        )
        print(f"zerolayer bench llamacpp: {llama['weight_repacking_note']}", file=sys.stderr)
    llama["exactness"] = exactness(model_dir, vocab_size, num_threads, repack, args)
    paths, systems = open_llama_systems(model_dir, gguf_types, num_threads, repack, args)
    for s in systems:
        stack.callback(s.close)
    llama["gguf_files"] = {t: str(p) for t, p in paths.items()}
    binary = find_llama_server(args.llama_server)
    server_reason = server_skip_reason(binary)
    if server_reason:
        llama["llama_server"] = skipped("llama-server (online serving)", server_reason)
        return llama, systems, {}
    servers = {}
    for t, path in paths.items():
        config = LlamaServerConfig(
            binary,
            path,
            free_port(),
            num_threads,
            args.online_slots,
            args.online_prompt_tokens + args.online_max_new_tokens,
            args.out / "logs" / f"llama-server-{t}.log",
            repack,
        )
        servers[f"llama-server {t.upper()}"] = stack.enter_context(LlamaServer(config))
    llama["llama_server"] = {
        "binary": str(binary),
        "argv": {n: s.config.argv() for n, s in servers.items()},
    }
    return llama, systems, servers
