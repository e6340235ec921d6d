"""The dummy models (random weights, presets): written once, deterministic, loadable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkpoints.model_modes import MODEL_MODES, modes
from safetensors.torch import load_file

from zerolayer.checkpoints.dummy import (
    PRESETS,
    DummyPreset,
    ensure_dummy_model,
    write_dummy_model,
)
from zerolayer.checkpoints.model_cache import remove_abandoned_writes
from zerolayer.checkpoints.model_config import ModelConfig


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


def test_a_longer_context_is_the_same_weights_cached_under_its_own_name(tmp_path: Path) -> None:
    default = ensure_dummy_model(cache_dir=tmp_path)
    assert ensure_dummy_model(cache_dir=tmp_path, max_position_embeddings=2048) == default
    longer = ensure_dummy_model(cache_dir=tmp_path, max_position_embeddings=8192)
    assert longer == tmp_path / "models" / "tiny-ctx8192-seed0-v1"
    assert json.loads((longer / "config.json").read_text())["max_position_embeddings"] == 8192
    weights, longer_weights = (load_file(d / "model.safetensors") for d in (default, longer))
    assert all(t.equal(weights[name]) for name, t in longer_weights.items())


@pytest.mark.usefixtures("strict_umask")
def test_the_cached_model_is_readable_by_every_user(tmp_path: Path) -> None:
    model_dir = ensure_dummy_model(cache_dir=tmp_path)
    assert modes(model_dir) == MODEL_MODES


@pytest.mark.usefixtures("strict_umask")
def test_a_written_model_and_the_directories_made_for_it_are_readable_by_every_user(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o700)  # an existing directory keeps its mode
    model_dir = write_dummy_model(tmp_path / "new" / "model", make_preset())
    assert modes(model_dir) == MODEL_MODES
    assert modes(tmp_path / "new")["."] == 0o755
    assert modes(tmp_path)["."] == 0o700


def test_tiny_preset_config_parses_with_byte_vocab(tmp_path: Path) -> None:
    model_dir = ensure_dummy_model(cache_dir=tmp_path)
    config = ModelConfig.from_json(
        (model_dir / "config.json").read_text(), (model_dir / "generation_config.json").read_text()
    )
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size) == (259, 4, 128)
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    assert PRESETS["small"].hidden_size == 768 and PRESETS["small"].dtype == "bfloat16"


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_writer_killed_by_sigterm_leaves_a_directory_the_next_call_removes(tmp_path: Path) -> None:
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from zerolayer.checkpoints.dummy import ensure_dummy_model; "
            "ensure_dummy_model('small', cache_dir=Path(sys.argv[1]))",
            str(tmp_path),
        ],
    )
    models = tmp_path / "models"
    deadline = time.monotonic() + 60
    while not list(models.glob(".small-seed0-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.send_signal(signal.SIGTERM)
    assert writer.wait(timeout=30) == -signal.SIGTERM
    (abandoned,) = models.glob(".small-seed0-*")
    assert abandoned.name.startswith(f".small-seed0-v1-{writer.pid}-")

    assert remove_abandoned_writes(models / "small-seed0-v1") == [abandoned]
    assert not abandoned.exists()


def test_ensure_removes_abandoned_writes_but_not_a_live_writers(tmp_path: Path) -> None:
    models = tmp_path / "models"
    abandoned = models / f".tiny-seed0-v1-{dead_pid()}-abc"
    live = models / f".tiny-seed0-v1-{os.getpid()}-def"
    other_model = models / f".small-seed0-v1-{dead_pid()}-ghi"
    for path in (abandoned, live, other_model):
        path.mkdir(parents=True)

    ensure_dummy_model("tiny", cache_dir=tmp_path)

    assert not abandoned.exists()
    assert live.exists() and other_model.exists()
    assert sorted(p.name for p in models.iterdir()) == sorted(
        [live.name, other_model.name, "tiny-seed0-v1"]
    )
