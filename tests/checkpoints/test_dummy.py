"""The embedded default model: written once, deterministic, loadable."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from services.checkpoints.dummy import PRESETS, DummyPreset, ensure_dummy_model, write_dummy_model
from services.common.model_config import ModelConfig


def make_preset() -> DummyPreset:
    return DummyPreset(32, 64, 2, 4, 2, 259, max_position_embeddings=128)


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = load_file(write_dummy_model(tmp_path / "a", make_preset(), seed=1) / "model.safetensors")
    b = load_file(write_dummy_model(tmp_path / "b", make_preset(), seed=1) / "model.safetensors")
    c = load_file(write_dummy_model(tmp_path / "c", make_preset(), seed=2) / "model.safetensors")
    assert sorted(a) == sorted(b) == sorted(c)
    assert all(a[name].equal(b[name]) for name in a)
    assert not a["lm_head.weight"].equal(c["lm_head.weight"])


def test_ensure_writes_once_and_reuses(tmp_path: Path) -> None:
    first = ensure_dummy_model(cache_dir=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    second = ensure_dummy_model(cache_dir=tmp_path)
    assert second == first == tmp_path / "models" / "tiny-seed0-v1"
    assert (second / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.joinpath("models").iterdir()] == ["tiny-seed0-v1"]


def test_tiny_preset_config_parses_with_byte_vocab(tmp_path: Path) -> None:
    model_dir = ensure_dummy_model(cache_dir=tmp_path)
    config = ModelConfig.from_json(
        (model_dir / "config.json").read_text(), (model_dir / "generation_config.json").read_text()
    )
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size) == (259, 4, 128)
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    assert PRESETS["small"].hidden_size == 768 and PRESETS["small"].dtype == "bfloat16"
