"""A GGUF checkpoint's manifest: transformers' names and shapes, the same ModelConfig as the
safetensors checkpoint it was written from (plus what GGUF changed in the weights), the tensor
types and their bytes, the quantized tensors' mapping, the ``--dtype`` rule; checked against the
``gguf`` package where it has the same tables."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_files import GGUF_FAMILIES, family_gguf

from benchmarks.llamacpp.gguf_export import export_gguf
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.config_json import ARCHITECTURES
from zerolayer.checkpoints.gguf.tensor_names import gguf_name, transformers_name
from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.checkpoints.weight_check import check_weights, expected_tensors
from zerolayer.kv.arena_layout import model_arena_layout
from zerolayer.scheduler.model.weights import MappedWeights
from zerolayer.sharing.manifest import model_dtype_name


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def test_the_type_table_is_ggmls() -> None:
    for name, served in SERVED_TYPES.items():
        qtype = gguf.GGMLQuantizationType[name]
        assert (served.ggml_type, (served.block_size, served.type_size)) == (
            qtype.value,
            gguf.GGML_QUANT_SIZES[qtype],
        )


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_names_are_the_reverse_of_gguf_pys_tensor_map(arch: str) -> None:
    config = ModelConfig.from_json(
        json.dumps(
            {
                "architectures": [ARCHITECTURES[arch]],
                "hidden_size": 8,
                "intermediate_size": 16,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "head_dim": 4,
                "vocab_size": 10,
                "tie_word_embeddings": False,
                "attention_bias": True,
            }
        )
    )
    key = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tensor_map = gguf.get_tensor_name_map(key, 2)
    names = expected_tensors(config)
    if arch in ("gemma", "gemma2"):
        names.pop("lm_head.weight")  # llama.cpp ties them: no GGUF name
    for name in names:
        module, _, kind = name.rpartition(".")
        assert gguf_name(name, arch) == f"{tensor_map.get_name(module)}.{kind}", name
        assert transformers_name(gguf_name(name, arch), arch) == name


EXPECTED_DIFFERENCES = {
    # field -> the GGUF config's value, where it differs from the safetensors one
    "llama-bias": {"qk_rows_interleaved": True},
    "llama-tied": {"qk_rows_interleaved": True},
    "mistral": {
        "qk_rows_interleaved": True,
        "architecture": "LlamaForCausalLM",  # GGUF's llama, as llama.cpp's converter writes it
        "sliding_window": None,  # llama.cpp's llama has none (256 positions: it never applied)
    },
    "gemma": {"gemma_norm_offset_stored": True},
    "gemma2": {"gemma_norm_offset_stored": True},
}


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_a_family_reads_as_its_safetensors_checkpoint(family: str, root: Path) -> None:
    model_dir, path = family_gguf(root, family)
    manifest = read_checkpoint(path)
    config = ModelConfig.from_json(manifest.config_json)
    check_weights(manifest, config)
    reference = read_checkpoint(model_dir)
    hf = ModelConfig.from_json(reference.config_json, reference.generation_config_json)
    rope = config.rope
    if family == "llama-tied":  # llama 3's scaling as llama.cpp's per-frequency divisors
        assert len(rope.freq_factors) == 8 and rope.freq_factors[0] == 1.0
        assert rope.freq_factors[-1] == pytest.approx(32.0)
        from zerolayer.scheduler.model.rope import inverse_frequencies

        torch.testing.assert_close(
            inverse_frequencies(rope, 16), inverse_frequencies(hf.rope, 16), rtol=1e-6, atol=0
        )
        rope = hf.rope
    # NOTE: GGUF stores the epsilon as a float32 (1e-6 reads 9.99999997e-07): the same float32
    assert np.float32(config.rms_norm_eps) == np.float32(hf.rms_norm_eps)
    ours = dataclasses.replace(config, rope=rope, rms_norm_eps=hf.rms_norm_eps)
    assert ours == dataclasses.replace(hf, **EXPECTED_DIFFERENCES.get(family, {}))
    used = set(expected_tensors(hf))
    specs = {t.name: t for t in manifest.tensors if t.name in used}
    stored = {t.name: t for t in reference.tensors}
    assert set(specs) == used
    assert {n: (t.dtype, t.shape) for n, t in specs.items()} == {
        n: (stored[n].dtype, stored[n].shape) for n in used
    }
    assert manifest.model == f"{family}-float32-f32"
    assert manifest.num_parameters >= reference.num_parameters - hf.vocab_size * hf.hidden_size


def test_quantized_tensors_map_as_their_blocks_in_place(root: Path) -> None:
    model_dir = ensure_dummy_model("tiny")
    path = export_gguf(model_dir, root / "tiny-q8_0.gguf", "q8_0")
    manifest = read_checkpoint(path)
    config = ModelConfig.from_json(manifest.config_json)
    check_weights(manifest, config)
    assert config.dtype == "bfloat16" and model_dtype_name(manifest) == "BF16"
    assert model_arena_layout(manifest, 16, 1 << 20).dtype == "BF16"
    specs = {t.name: t for t in manifest.tensors}
    q = specs["model.layers.0.self_attn.q_proj.weight"]
    assert (q.dtype, q.shape, q.nbytes) == ("Q8_0", (128, 128), 128 * 128 // 32 * 34)
    assert specs["model.norm.weight"].dtype == "F32"
    weights = MappedWeights(manifest)
    assert weights.quant_types["model.layers.0.self_attn.q_proj.weight"] == "Q8_0"
    assert "model.norm.weight" not in weights.quant_types
    view = weights.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert (view.dtype, tuple(view.shape)) == (torch.uint8, (128, 4 * 34))
    assert weights.contains(view)
    blocks = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    np.testing.assert_array_equal(view.numpy(), np.asarray(blocks.data))


@pytest.mark.parametrize(
    ("gguf_type", "stored", "auto"),
    [
        ("f32", "F32", "float32"),
        ("bf16", "BF16", "bfloat16"),
        ("f16", "F16", "bfloat16"),
        ("q4_0", "Q4_0", "bfloat16"),
    ],
)
def test_the_compute_dtype_is_float32_only_for_an_all_f32_file(
    gguf_type: str, stored: str, auto: str, root: Path
) -> None:
    path = export_gguf(ensure_dummy_model("tiny"), root / f"tiny-{gguf_type}.gguf", gguf_type)
    manifest = read_checkpoint(path)
    assert {t.dtype for t in manifest.tensors if len(t.shape) == 2} == {stored}
    assert ModelConfig.from_json(manifest.config_json).dtype == auto
    for asked in ("bfloat16", "float32"):
        chosen = read_checkpoint(path, dtype=asked)
        assert json.loads(chosen.config_json)["dtype"] == asked
        check_weights(chosen, ModelConfig.from_json(chosen.config_json), asked)


def test_a_safetensors_checkpoint_takes_only_its_stored_dtype() -> None:
    manifest = read_checkpoint(ensure_dummy_model("tiny"))
    config = ModelConfig.from_json(manifest.config_json)
    check_weights(manifest, config, "float32")
    with pytest.raises(
        CheckpointError, match="--dtype bfloat16: this safetensors checkpoint computes in float32"
    ):
        check_weights(manifest, config, "bfloat16")


def test_the_loader_reads_a_gguf_file_without_torch(root: Path) -> None:
    path = export_gguf(ensure_dummy_model("tiny"), root / "tiny-noimport.gguf", "q8_0")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from zerolayer.loader.weight_store import WeightStore\n"
        f"store = WeightStore(Path({str(path)!r}))\n"
        "print(len(store.manifest.tensors), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["39", "False"]
