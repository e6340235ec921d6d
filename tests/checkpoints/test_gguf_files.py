"""Each kind of bad GGUF file is refused in one line naming the tensor or metadata key: by the
reader (``read_checkpoint``) and, before anything starts, by ``zerolayer up``'s pre-flight (in
process)."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from factories import in_process
from gguf_files import (
    patch,
    patch_string,
    patch_u32,
    rename_key,
    tensor_info_offsets,
)

from benchmarks.llamacpp.gguf_export import export_gguf
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.checkpoints.errors import CheckpointError


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dummy model (4 layers, hidden 128, a 259-token byte vocabulary) as an F32
    GGUF file."""
    return export_gguf(
        ensure_dummy_model("tiny"), tmp_path_factory.mktemp("g") / "tiny.gguf", "f32"
    )


def truncate_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(1000)


def truncate_data(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)


def unknown_type(path: Path) -> None:
    patch(path, tensor_info_offsets(path, "blk.1.attn_v.weight")[0], struct.pack("<I", 99))


def unserved_type(path: Path) -> None:  # Q2_K: a ggml type zerolayer does not serve
    patch(path, tensor_info_offsets(path, "blk.1.attn_v.weight")[0], struct.pack("<I", 10))


def misaligned(path: Path) -> None:
    offset = tensor_info_offsets(path, "blk.2.ffn_up.weight")[1]
    with open(path, "rb") as f:
        f.seek(offset)
        (value,) = struct.unpack("<Q", f.read(8))
    patch(path, offset, struct.pack("<Q", value + 4))


BAD_FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated header": (
        truncate_header,
        "the metadata entry after key 'tokenizer.ggml.pre' ends past the end of the file "
        "(1000 bytes): truncated",
    ),
    "truncated data": (
        truncate_data,
        "tensor 'blk.3.ffn_up.weight': data ends at byte 2636000, past the end of the file "
        "(2635900 bytes): truncated",
    ),
    "unknown tensor type": (
        unknown_type,
        "tensor 'blk.1.attn_v.weight' has type 99 (unknown), which zerolayer does not serve",
    ),
    "unserved tensor type": (
        unserved_type,
        "tensor 'blk.1.attn_v.weight' has type 10 (Q2_K), which zerolayer does not serve",
    ),
    "missing metadata key": (
        lambda p: rename_key(p, "llama.block_count", "llama.block_coun_"),
        "metadata key 'llama.block_count' is missing",
    ),
    "shape against metadata": (
        lambda p: patch_u32(p, "llama.feed_forward_length", 255),
        "checkpoint: tensor 'model.layers.0.mlp.down_proj.weight' has shape [128, 256], the "
        "metadata implies [128, 255] (GGUF 'blk.0.ffn_down.weight')",
    ),
    "misaligned data": (
        misaligned,
        "tensor 'blk.2.ffn_up.weight': data offset",
    ),
    "architecture": (
        lambda p: patch_string(p, "general.architecture", "mamba"),
        "metadata key 'general.architecture' is 'mamba', which zerolayer does not serve "
        "(served: llama, qwen2, qwen3, phi3, gemma, gemma2)",
    ),
    "pre-tokenizer": (
        lambda p: patch_string(p, "tokenizer.ggml.pre", "xefault"),
        "metadata key 'tokenizer.ggml.pre' is 'xefault', a pre-tokenizer zerolayer does not serve",
    ),
    "kv heads": (
        lambda p: patch_u32(p, "llama.attention.head_count_kv", 3),
        "metadata key 'llama.attention.head_count_kv' is 3, not a divisor of "
        "'llama.attention.head_count' (4)",
    ),
}
"""Per kind of bad file: how it is made from the good one, and what its refusal says."""


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_refused_naming_the_tensor_or_key(
    case: str, good_gguf: Path, tmp_path: Path
) -> None:
    make_bad, message = BAD_FILES[case]
    path = tmp_path / "bad.gguf"
    shutil.copy(good_gguf, path)
    make_bad(path)
    with pytest.raises(CheckpointError) as refused:
        from zerolayer.checkpoints.model_config import ModelConfig
        from zerolayer.checkpoints.weight_check import check_weights

        manifest = read_checkpoint(path)
        check_weights(manifest, ModelConfig.from_json(manifest.config_json))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("case", ["truncated data", "unknown tensor type", "missing metadata key"])
def test_up_refuses_a_bad_file_in_one_line_before_anything_starts(
    case: str, good_gguf: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    make_bad, message = BAD_FILES[case]
    path = tmp_path / "bad.gguf"
    shutil.copy(good_gguf, path)
    make_bad(path)
    code, err = in_process(capfd, "up", "--model", str(path), "--run-dir", str(tmp_path / "run"))
    assert code == 2, err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith(f"zerolayer up: error: --model: {path}: ") and message in last
    assert "Traceback" not in err and "listening on" not in err
    assert not (tmp_path / "run").exists()


def test_not_a_gguf_file_and_a_missing_one_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(CheckpointError, match=r"x.gguf: not a GGUF file \(it starts b'PK"):
        read_checkpoint(tmp_path / "x.gguf")
    with pytest.raises(CheckpointError, match="nope.gguf: no such file"):
        read_checkpoint(tmp_path / "nope.gguf")


def test_a_split_file_is_one_checkpoint_and_a_missing_or_wrong_part_is_refused(
    tmp_path: Path,
) -> None:
    model_dir = ensure_dummy_model("tiny")
    whole = read_checkpoint(export_gguf(model_dir, tmp_path / "whole" / "t.gguf", "f32"))
    first = export_gguf(model_dir, tmp_path / "split" / "t.gguf", "f32", split_max_tensors=15)
    parts = sorted((tmp_path / "split").iterdir())
    assert [p.name for p in parts] == [f"t-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert first == parts[0]
    for given in (parts[0], parts[2], tmp_path / "split"):
        split = read_checkpoint(given)
        assert split.model == ("split" if given.is_dir() else "t")
        assert split.files == tuple(str(p) for p in parts)
        assert [(t.name, t.shape, t.file_index > 0) for t in split.tensors][:2] == [
            (t.name, t.shape, False) for t in whole.tensors[:2]
        ]
        assert sorted((t.name, t.dtype, t.shape, t.nbytes) for t in split.tensors) == sorted(
            (t.name, t.dtype, t.shape, t.nbytes) for t in whole.tensors
        )
        assert (split.config_json, split.tokenizer_json) == (
            whole.config_json,
            whole.tokenizer_json,
        )
    patch(parts[1], _split_no_offset(parts[1]), struct.pack("<H", 2))
    with pytest.raises(
        CheckpointError,
        match="t-00002-of-00003.gguf: metadata key 'split.no' is 2, but it is part 1",
    ):
        read_checkpoint(parts[0])
    parts[2].unlink()
    with pytest.raises(CheckpointError, match="t-00003-of-00003.gguf: missing"):
        read_checkpoint(parts[0])


def _split_no_offset(path: Path) -> int:
    from gguf_files import value_offset

    return value_offset(path, "split.no")


def test_a_folder_of_several_gguf_files_is_refused(good_gguf: Path, tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(good_gguf, tmp_path / name)
    with pytest.raises(
        CheckpointError, match=r"several GGUF checkpoints \(a.gguf, b.gguf\); give --model the file"
    ):
        read_checkpoint(tmp_path)
