"""The llama-server arm of ``zerolayer bench agent`` before it starts anything: its prompt cache's
size and command line (benchmarks/llamacpp/agent.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.llamacpp import agent
from benchmarks.llamacpp.server import LlamaServerConfig
from zerolayer.bench.agent_sessions import AgentWorkload


def test_a_token_of_llama_cpps_kv_is_f16_k_and_v_of_every_layer() -> None:
    tiny = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert agent.kv_bytes_per_token({**tiny, "num_hidden_layers": 4}) == 2 * 4 * 2 * 32 * 2
    explicit = {**tiny, "num_hidden_layers": 1, "head_dim": 64}
    assert agent.kv_bytes_per_token(explicit) == 2 * 1 * 2 * 64 * 2


def test_slots_and_prompt_cache_hold_as_many_tokens_as_zerolayers_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        '{"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"num_hidden_layers": 4, "torch_dtype": "float32"}'
    )
    exported: list[str] = []

    def ensure_gguf(model: Path, cache_dir: Path, gguf_type: str) -> Path:
        exported.append(gguf_type)
        return cache_dir / "model.gguf"

    monkeypatch.setattr("benchmarks.llamacpp.gguf_export.ensure_gguf", ensure_gguf)
    w = AgentWorkload()  # 4 sessions of 5248 tokens, 2 background streams
    args = argparse.Namespace(out=tmp_path, llama_cache_ram_mib=None)
    sizes = {"tokens": 3 * w.sessions_tokens}
    config = agent.server_config(args, Path("llama-server"), model_dir, w, sizes)
    assert exported == ["f32"]
    assert (config.num_slots, config.max_seq_tokens) == (6, 5248)
    # 62976 pool tokens - 6 slots of 5248 = 31488 tokens of 1024 bytes: 30.75 MiB
    assert config.cache_ram_mib == 31
    assert config.argv()[-2:] == ["--cache-ram", "31"]
    args.llama_cache_ram_mib = 0
    assert agent.server_config(args, Path("llama-server"), model_dir, w, sizes).cache_ram_mib == 0


def test_without_a_cache_size_llama_server_keeps_its_default() -> None:
    config = LlamaServerConfig(Path("s"), Path("m.gguf"), 1, 2, 3, 64, Path("log"))
    assert "--cache-ram" not in config.argv()
