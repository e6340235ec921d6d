"""The default model: the package's llama2.c stories260K, converted once into the cache, writes
stories (the greedy run llama2.c's own tests expect)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from checkpoints.model_modes import MODEL_MODES, modes
from tokenizers import Tokenizer

from zerolayer.bench.inprocess import local_engine_for_stack
from zerolayer.checkpoints.default_model import ensure_default_model
from zerolayer.checkpoints.llama2c import convert_llama2c
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput, SamplingParams
from zerolayer.stack.config import StackConfig

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "zerolayer" / "checkpoints" / "data" / "stories260K"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def greedy_ids(model_dir: Path, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy generation by the engine ``zerolayer up`` would run on ``model_dir``, in process."""
    engine = local_engine_for_stack(StackConfig(model_dir=str(model_dir), kv_cache_bytes=1 << 24))
    outputs: list[RequestOutput | Exception] = []
    request = EngineRequest("story", tuple(prompt_token_ids), max_new_tokens, SamplingParams())
    engine.submit(request, outputs.append)
    engine.process_commands()
    while engine.scheduler.has_unfinished_requests:
        engine.step()
    assert not [o for o in outputs if isinstance(o, Exception)]
    assert outputs[-1].finish_reason == FinishReason.LENGTH
    return [token for output in outputs for token in output.new_token_ids]


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_package_ships_the_unchanged_llama2c_files_and_their_licence(stories_dir: Path) -> None:
    for name in ("stories260K.bin", "tok512.bin"):
        assert sha256(DATA / name) == sha256(stories_dir / name)
    assert "Copyright (c) 2023 Andrej" in (DATA / "LICENSE").read_text()
    assert "llama2.c" in (DATA / "README.md").read_text()


def test_the_model_files_are_package_data_of_a_wheel() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["zerolayer.checkpoints"]
    names = sorted(p.name for p in DATA.iterdir())
    assert names == ["LICENSE", "README.md", "stories260K.bin", "tok512.bin"]
    for name in names:
        assert any(fnmatch.fnmatch(f"data/stories260K/{name}", glob) for glob in package_data)


def test_the_default_model_is_converted_stories260k_in_the_cache(
    default_dir: Path, stories_dir: Path, tmp_path: Path
) -> None:
    assert default_dir.parent.name == "models" and default_dir.name == "stories260K-v1"
    reference = tmp_path / "reference"
    convert_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin", reference)
    for name in sorted(p.name for p in reference.iterdir()):
        assert (default_dir / name).read_bytes() == (reference / name).read_bytes(), name
    config = json.loads((default_dir / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
        64,
        5,
        512,
    )


def test_converted_once_then_reused(tmp_path: Path) -> None:
    first = ensure_default_model(cache_dir=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_model(cache_dir=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["stories260K-v1"]


@pytest.mark.usefixtures("strict_umask")
def test_the_cached_default_model_is_readable_by_every_user(tmp_path: Path) -> None:
    assert modes(ensure_default_model(cache_dir=tmp_path)) == MODEL_MODES


def test_greedy_from_bos_is_llama2c_s_expected_story(default_dir: Path, stories_dir: Path) -> None:
    expected_ids = json.loads((stories_dir / "expected_greedy_200_ids.json").read_text())
    expected_text = (stories_dir / "expected_greedy_200.txt").read_text()
    ids = greedy_ids(default_dir, [1], 200)
    assert ids == expected_ids
    tokenizer = Tokenizer.from_file(str(default_dir / "tokenizer.json"))
    assert tokenizer.decode(ids) == expected_text
    assert expected_text.startswith("Once upon a time, there was a little girl named Lily.")
