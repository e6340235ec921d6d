"""A ``--model`` that is no Hugging Face directory: the error line ends with what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint

DATA = Path(__file__).resolve().parents[2] / "zerolayer/checkpoints/data/stories260K"
CONVERT = "convert it first: zerolayer convert-llama2c MODEL.bin TOKENIZER.bin OUT_DIR"


def refusal(model_dir: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(model_dir)
    return str(info.value)


def test_a_llama2c_folder_points_to_convert_llama2c(tmp_path: Path) -> None:
    folder = shutil.copytree(DATA, tmp_path / "stories260K")
    assert refusal(folder) == (
        f"{folder}: missing config.json (a llama2.c checkpoint? {CONVERT}, then --model OUT_DIR)"
    )


def test_a_bin_file_points_to_convert_llama2c() -> None:
    path = DATA / "stories260K.bin"
    assert refusal(path) == (
        f"{path}: not a directory (a llama2.c checkpoint? {CONVERT}, then --model OUT_DIR)"
    )


def test_a_hub_id_says_it_is_not_downloaded_and_how_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert refusal(Path("meta-llama/Llama-3.2-1B")) == (
        f"{tmp_path}/meta-llama/Llama-3.2-1B: not a directory (zerolayer does not download "
        "models; to serve the hub's meta-llama/Llama-3.2-1B, fetch it first: hf download "
        "meta-llama/Llama-3.2-1B --local-dir DIR (huggingface_hub's CLI; older: "
        "huggingface-cli download), then --model DIR)"
    )


def test_a_hub_cache_folder_points_to_its_snapshots(tmp_path: Path) -> None:
    cache = tmp_path / "models--meta-llama--Llama-3.2-1B"
    (cache / "snapshots/0123abc").mkdir(parents=True)
    assert refusal(cache) == (
        f"{cache}: missing config.json (a Hugging Face cache folder: give one of its snapshots, "
        f"{cache}/snapshots/COMMIT)"
    )


def test_a_plain_missing_path_gets_no_hint(tmp_path: Path) -> None:
    assert refusal(tmp_path / "nothing") == f"{tmp_path}/nothing: not a directory"
