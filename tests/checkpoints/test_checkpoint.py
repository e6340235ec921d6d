"""Tests for reading a model directory: safetensors headers, the manifest, refused pickles."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.checkpoints.checkpoint import (
    CheckpointError,
    read_checkpoint,
    read_safetensors_header,
)
from zerolayer.sharing.manifest import HandleKind, TensorSpec

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 259,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def make_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three dtypes, element sizes 4 and 2, one odd-sized tensor to exercise offsets."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(5, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(3, 8, generator=g).to(torch.float16),
        "model.layers.0.odd": torch.randn(3, generator=g).to(torch.float16),
    }


def make_model_dir(
    tmp_path: Path, tensors: dict[str, torch.Tensor] | None = None, name: str = "tiny"
) -> Path:
    model_dir = tmp_path / name
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    write_byte_level_tokenizer(model_dir, 2048)
    save_file(tensors if tensors is not None else make_tensors(), model_dir / "model.safetensors")
    return model_dir


def make_sharded_model_dir(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = make_tensors()
    shards = {
        "model-00001-of-00002.safetensors": ["model.embed_tokens.weight", "model.norm.weight"],
        "model-00002-of-00002.safetensors": ["lm_head.weight", "model.layers.0.odd"],
    }
    model_dir = make_model_dir(tmp_path, tensors={})
    (model_dir / "model.safetensors").unlink()
    weight_map = {}
    for file_name, names in shards.items():
        save_file({n: tensors[n] for n in names}, model_dir / file_name)
        weight_map.update(dict.fromkeys(names, file_name))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    return model_dir, tensors


def write_raw_safetensors(path: Path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def read_spec_bytes(files: tuple[str, ...], spec: TensorSpec) -> bytes:
    with open(files[spec.file_index], "rb") as f:
        f.seek(spec.offset_bytes)
        return f.read(spec.nbytes)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    # numpy has no bfloat16: compare raw 16-bit patterns instead.
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


def test_header_lists_every_tensor_with_its_offsets(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    tensors = make_tensors()
    save_file(tensors, path, metadata={"format": "pt"})
    header, data_start = read_safetensors_header(path)
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert data_start == 8 + header_len
    assert "__metadata__" not in header
    assert {name: (e["dtype"], e["shape"]) for name, e in header.items()} == {
        "model.embed_tokens.weight": ("F32", [5, 8]),
        "model.norm.weight": ("BF16", [8]),
        "lm_head.weight": ("F16", [3, 8]),
        "model.layers.0.odd": ("F16", [3]),
    }
    # safetensors packs tensors by dtype (F32, BF16, F16: its Dtype enum, descending), then name.
    assert {name: e["data_offsets"] for name, e in header.items()} == {
        "model.embed_tokens.weight": [0, 160],
        "model.norm.weight": [160, 176],
        "lm_head.weight": [176, 224],
        "model.layers.0.odd": [224, 230],
    }
    assert path.stat().st_size == data_start + 230


def test_read_checkpoint_specs_point_at_the_tensor_bytes(tmp_path: Path) -> None:
    tensors = make_tensors()
    model_dir = make_model_dir(tmp_path, tensors)
    manifest = read_checkpoint(model_dir)
    weight_file = model_dir / "model.safetensors"
    _, data_start = read_safetensors_header(weight_file)
    assert manifest.files == (str(weight_file.resolve()),)
    assert manifest.file_sizes == (weight_file.stat().st_size,)
    assert manifest.tensors == (
        TensorSpec("lm_head.weight", "F16", (3, 8), 0, data_start + 176, 48),
        TensorSpec("model.embed_tokens.weight", "F32", (5, 8), 0, data_start, 160),
        TensorSpec("model.layers.0.odd", "F16", (3,), 0, data_start + 224, 6),
        TensorSpec("model.norm.weight", "BF16", (8,), 0, data_start + 160, 16),
    )
    for spec in manifest.tensors:
        assert read_spec_bytes(manifest.files, spec) == tensor_bytes(tensors[spec.name])
    assert manifest.num_parameters == 24 + 40 + 3 + 8


def test_read_checkpoint_carries_configs_and_tokenizer(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    manifest = read_checkpoint(model_dir)
    assert manifest.model == "tiny"
    assert read_checkpoint(model_dir, model_name="served-name").model == "served-name"
    assert manifest.model_dir == str(model_dir.resolve())
    assert json.loads(manifest.config_json) == TINY_LLAMA_CONFIG
    assert manifest.generation_config_json == ""
    assert manifest.tokenizer_json == (model_dir / "tokenizer.json").read_text()
    assert json.loads(manifest.tokenizer_config_json)["model_max_length"] == 2048
    assert manifest.handle_kind == HandleKind.MMAP_FILE


def test_generation_config_is_read_when_present(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    (model_dir / "generation_config.json").write_text('{"eos_token_id": [2, 7]}')
    assert read_checkpoint(model_dir).generation_config_json == '{"eos_token_id": [2, 7]}'


def test_chat_template_jinja_is_read_when_present(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    assert read_checkpoint(model_dir).chat_template_jinja == ""
    (model_dir / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert read_checkpoint(model_dir).chat_template_jinja == "{{ messages[0].content }}"


def test_sharded_checkpoint_lists_both_files(tmp_path: Path) -> None:
    model_dir, tensors = make_sharded_model_dir(tmp_path)
    manifest = read_checkpoint(model_dir)
    first = model_dir / "model-00001-of-00002.safetensors"
    second = model_dir / "model-00002-of-00002.safetensors"
    _, start1 = read_safetensors_header(first)
    _, start2 = read_safetensors_header(second)
    assert manifest.files == (str(first.resolve()), str(second.resolve()))
    assert manifest.file_sizes == (first.stat().st_size, second.stat().st_size)
    assert manifest.tensors == (
        TensorSpec("model.embed_tokens.weight", "F32", (5, 8), 0, start1, 160),
        TensorSpec("model.norm.weight", "BF16", (8,), 0, start1 + 160, 16),
        TensorSpec("lm_head.weight", "F16", (3, 8), 1, start2, 48),
        TensorSpec("model.layers.0.odd", "F16", (3,), 1, start2 + 48, 6),
    )
    for spec in manifest.tensors:
        assert read_spec_bytes(manifest.files, spec) == tensor_bytes(tensors[spec.name])


def test_unindexed_shards_are_all_listed_in_name_order(tmp_path: Path) -> None:
    model_dir, _ = make_sharded_model_dir(tmp_path)
    (model_dir / "model.safetensors.index.json").unlink()
    assert [Path(f).name for f in read_checkpoint(model_dir).files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


@pytest.mark.parametrize("pickle_name", ["pytorch_model.bin", "model.pt"])
def test_pickled_checkpoint_is_refused_without_unpickling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pickle_name: str
) -> None:
    model_dir = make_model_dir(tmp_path)
    (model_dir / "model.safetensors").unlink()
    torch.save(make_tensors(), model_dir / pickle_name)

    def refuse_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load was called on a pickled checkpoint")

    monkeypatch.setattr(torch, "load", refuse_load)
    with pytest.raises(CheckpointError, match="only pickled checkpoints found") as info:
        read_checkpoint(model_dir)
    message = str(info.value)
    assert pickle_name in message
    assert "refuses them because loading a pickle runs arbitrary code" in message
    assert "safetensors" in message


def test_directory_without_weights_is_refused(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors files"):
        read_checkpoint(model_dir)


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json"])
def test_missing_required_file_is_refused(tmp_path: Path, missing: str) -> None:
    model_dir = make_model_dir(tmp_path)
    (model_dir / missing).unlink()
    with pytest.raises(CheckpointError, match=f"missing {missing}$"):
        read_checkpoint(model_dir)


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        read_checkpoint(tmp_path / "nope")


GOOD_ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "too short for a safetensors file"),
        (b"\x10\x00\x00", "too short for a safetensors file"),
        (struct.pack("<Q", 1000) + b"{}", "header length 1000 is invalid"),
        (struct.pack("<Q", 2**63) + b"{}", "header length 9223372036854775808 is invalid"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "header is not JSON"),
        (struct.pack("<Q", 8) + b"not json", "header is not JSON"),
        (
            struct.pack("<Q", 58)
            + b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'[:58],
            "header is not JSON",
        ),
    ],
    ids=["empty", "short", "long-header", "huge-header", "not-utf8", "not-json", "truncated-json"],
)
def test_garbage_header_is_refused(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match=message):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    "data_offsets",
    [[0, 9], [8, 4], [-1, 8], [0, 2**40]],
    ids=["past-end", "reversed", "negative", "huge"],
)
def test_offsets_outside_the_file_are_refused(tmp_path: Path, data_offsets: list[int]) -> None:
    path = tmp_path / "bad.safetensors"
    header = json.dumps({"w": {**GOOD_ENTRY, "data_offsets": data_offsets}}).encode()
    write_raw_safetensors(path, header, b"\0" * 8)
    with pytest.raises(CheckpointError, match="tensor 'w' has offsets outside the file"):
        read_safetensors_header(path)


def test_truncated_data_section_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file(make_tensors(), path)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="'model.layers.0.odd' has offsets outside the file"):
        read_safetensors_header(path)


NOT_AN_OBJECT = "header is not a JSON object"
NO_OFFSETS = r"tensor 'w' has no \[begin, end\] data_offsets"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"[1, 2]", NOT_AN_OBJECT),
        (b'"text"', NOT_AN_OBJECT),
        (b'{"w": [0, 8]}', NO_OFFSETS),
        (b'{"w": {"dtype": "F32", "shape": [2]}}', NO_OFFSETS),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}', NO_OFFSETS),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}', NO_OFFSETS),
        (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}', NO_OFFSETS),
    ],
    ids=["list", "string", "entry-not-object", "no-offsets", "one-offset", "str-offsets", "floats"],
)
def test_malformed_header_structure_is_refused(tmp_path: Path, header: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    write_raw_safetensors(path, header, b"\0" * 8)
    with pytest.raises(CheckpointError, match=message):
        read_safetensors_header(path)


def test_garbage_weight_file_fails_read_checkpoint(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    (model_dir / "model.safetensors").write_bytes(os.urandom(64))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        read_checkpoint(model_dir)


def test_fingerprint_is_stable_for_the_same_files(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    first = read_checkpoint(model_dir).fingerprint
    assert len(first) == 32
    assert read_checkpoint(model_dir).fingerprint == first
    assert read_checkpoint(model_dir, model_name="other").fingerprint == first


def test_fingerprint_changes_when_weights_are_rewritten(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, make_tensors(seed=0))
    weight_file = model_dir / "model.safetensors"
    before = read_checkpoint(model_dir).fingerprint
    old_mtime_ns = weight_file.stat().st_mtime_ns
    save_file(make_tensors(seed=1), weight_file)  # same names, shapes and size; new values
    # NOTE: the fingerprint keys on header, size and mtime, not on the bytes; pin the rewrite's
    # mtime one second later so that a coarse filesystem clock cannot hide it.
    os.utime(weight_file, ns=(old_mtime_ns + 10**9, old_mtime_ns + 10**9))
    after = read_checkpoint(model_dir).fingerprint
    assert after != before
    assert read_checkpoint(model_dir).fingerprint == after


def test_fingerprint_changes_with_config(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path)
    before = read_checkpoint(model_dir).fingerprint
    stat_before = (model_dir / "model.safetensors").stat()
    (model_dir / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG, "rope_theta": 5e5}))
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stat_before.st_mtime_ns
    assert read_checkpoint(model_dir).fingerprint != before


def rewrite_index(model_dir: Path, weight_map: dict[str, str]) -> None:
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))


SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lm_head.weight": "missing.safetensors"}, "shard 'missing.safetensors' does not exist"),
        ({"lm_head.weight": "../x.safetensors"}, "'../x.safetensors', not a file name relative"),
        ({"lm_head.weight": "/tmp/x.safetensors"}, "'/tmp/x.safetensors', not a file name"),
        ({"lm_head.weight": SHARD_1}, f"{SHARD_2} holds tensor 'lm_head.weight', which the index"),
        ({"model.extra": SHARD_1}, f"tensor 'model.extra' is not in {SHARD_1}"),
        ({"lm_head.weight": None}, f"{SHARD_2} holds tensor 'lm_head.weight', not indexed"),
        ({"lm_head.weight": 3}, "tensor 'lm_head.weight' maps to 3, not a file name"),
    ],
    ids=["missing-file", "dotdot", "absolute", "wrong-shard", "not-in-shard", "unindexed", "type"],
)
def test_index_that_disagrees_with_the_shards_is_refused(
    tmp_path: Path, change: dict, message: str
) -> None:
    model_dir, _ = make_sharded_model_dir(tmp_path)
    (tmp_path / "x.safetensors").write_bytes((model_dir / SHARD_2).read_bytes())
    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for name, file_name in change.items():
        if file_name is None:
            del weight_map[name]
        else:
            weight_map[name] = file_name
    rewrite_index(model_dir, weight_map)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        read_checkpoint(model_dir)


@pytest.mark.parametrize("text", ["[]", "{}", '{"weight_map": []}', "not json"])
def test_malformed_index_is_refused(tmp_path: Path, text: str) -> None:
    model_dir, _ = make_sharded_model_dir(tmp_path)
    (model_dir / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: "):
        read_checkpoint(model_dir)


@pytest.mark.parametrize("indexed", [True, False])
def test_tensor_in_two_shards_is_refused(tmp_path: Path, indexed: bool) -> None:
    model_dir, tensors = make_sharded_model_dir(tmp_path)
    names = ["lm_head.weight", "model.layers.0.odd", "model.norm.weight"]
    save_file({n: tensors[n] for n in names}, model_dir / SHARD_2)
    if not indexed:
        (model_dir / "model.safetensors.index.json").unlink()
    first, second = (str((model_dir / n).resolve()) for n in (SHARD_1, SHARD_2))
    with pytest.raises(
        CheckpointError, match=re.escape(f"'model.norm.weight' is in both {first} and {second}")
    ):
        read_checkpoint(model_dir)
