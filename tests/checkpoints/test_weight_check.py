"""Checkpoint refusals from safetensors headers: missing tensors, shapes, dtypes, alignment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zerolayer.checkpoints.checkpoint import CheckpointError, read_checkpoint
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import check_weights, compute_dtype, expected_tensors
from zerolayer.sharing.manifest import WeightManifest

PRESET = DummyPreset(64, 96, 2, 4, 2, 259, 128, dtype="bfloat16")
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
NORM = "model.layers.1.input_layernorm.weight"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> WeightManifest:
    return read_checkpoint(write_dummy_model(tmp_path_factory.mktemp("m"), PRESET, seed=1))


def config_of(manifest: WeightManifest, **fields: object) -> ModelConfig:
    cfg = {**json.loads(manifest.config_json), **fields}
    return ModelConfig.from_json(json.dumps(cfg), manifest.generation_config_json)


def with_tensor(manifest: WeightManifest, name: str, **changes: object) -> WeightManifest:
    tensors = tuple(
        dataclasses.replace(t, **changes) if t.name == name else t for t in manifest.tensors
    )
    return dataclasses.replace(manifest, tensors=tensors)


def refusal(manifest: WeightManifest, config: ModelConfig) -> str:
    with pytest.raises(CheckpointError) as info:
        check_weights(manifest, config)
    return str(info.value)


def test_the_dummy_checkpoint_passes(manifest: WeightManifest) -> None:
    config = config_of(manifest)
    check_weights(manifest, config)
    assert compute_dtype(manifest, config) == "bfloat16"
    assert set(expected_tensors(config)) <= {t.name for t in manifest.tensors}


def test_missing_tensor_is_named(manifest: WeightManifest) -> None:
    without = dataclasses.replace(
        manifest, tensors=tuple(t for t in manifest.tensors if t.name != Q_PROJ)
    )
    assert refusal(without, config_of(manifest)) == f"checkpoint: missing tensor {Q_PROJ!r}"


def test_untied_head_needs_lm_head(manifest: WeightManifest) -> None:
    without = dataclasses.replace(
        manifest, tensors=tuple(t for t in manifest.tensors if t.name != "lm_head.weight")
    )
    assert "(config.json says tie_word_embeddings=false)" in refusal(without, config_of(manifest))
    check_weights(without, config_of(manifest, tie_word_embeddings=True))


def test_biases_the_config_asks_for_are_required(manifest: WeightManifest) -> None:
    message = refusal(manifest, config_of(manifest, attention_bias=True))
    assert message == "checkpoint: missing tensor 'model.layers.0.self_attn.q_proj.bias'"


def test_shape_mismatch_names_tensor_shape_and_expected(manifest: WeightManifest) -> None:
    message = refusal(manifest, config_of(manifest, intermediate_size=128))
    assert message == (
        "checkpoint: tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 96], the config "
        "implies [64, 128]"
    )


def test_unsupported_dtype_is_named(manifest: WeightManifest) -> None:
    quantized = with_tensor(manifest, Q_PROJ, dtype="I8")
    assert refusal(quantized, config_of(manifest)) == (
        f"checkpoint: tensor {Q_PROJ!r} has dtype I8 (supported: F32, F16, BF16)"
    )


def test_matrix_in_another_dtype_is_refused(manifest: WeightManifest) -> None:
    mixed = with_tensor(manifest, Q_PROJ, dtype="F16")
    assert refusal(mixed, config_of(manifest)).startswith(
        f"checkpoint: tensor {Q_PROJ!r} is stored as float16, the model computes in bfloat16"
    )


def test_config_dtype_other_than_the_weights_is_refused(manifest: WeightManifest) -> None:
    message = refusal(manifest, config_of(manifest, torch_dtype="float32"))
    assert "is stored as bfloat16, the model computes in float32" in message


def test_float32_vectors_in_a_bfloat16_checkpoint_pass(manifest: WeightManifest) -> None:
    check_weights(with_tensor(manifest, NORM, dtype="F32"), config_of(manifest))


def test_misaligned_data_is_refused(manifest: WeightManifest) -> None:
    offset = next(t.offset_bytes for t in manifest.tensors if t.name == NORM) + 1
    message = refusal(with_tensor(manifest, NORM, offset_bytes=offset), config_of(manifest))
    assert message == (
        f"checkpoint: tensor {NORM!r} data at byte {offset} is not aligned to its 2-byte elements"
    )


def test_fused_phi3_names_and_shapes(tmp_path: Path) -> None:
    cfg = ModelConfig.from_json(
        json.dumps(
            {
                "architectures": ["Phi3ForCausalLM"],
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 259,
            }
        )
    )
    shapes = expected_tensors(cfg)
    assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == (64 + 2 * 32, 64)
    assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == (192, 64)
    assert "model.layers.0.self_attn.q_proj.weight" not in shapes
