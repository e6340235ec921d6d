"""The forward over GGUF weights (LlamaModel with ``quant_types``): every matrix, the embedding
and the LM head used in their blocks, against transformers in float32 on the dequantized weights
(greedy tokens), and the bfloat16 default's agreement with it (teacher-forced). The weights dict
is built by hand here, as the GGUF reader's MappedWeights gives it (uint8 blocks, the float
types as they are)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from factories import generate, hf_generate, make_engine, make_prompt
from safetensors.torch import save_file

from benchmarks.llamacpp.gguf_kquants import quantize
from zerolayer.bench.inprocess import LocalModel
from zerolayer.bench.logit_agreement import agreement, model_logits
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel

# K a multiple of 256 everywhere (the K-quants' super-blocks): hidden 256, intermediate 512
PRESET = DummyPreset(256, 512, 2, 4, 2, 259)
Q4_K_M = {"v_proj": "Q6_K", "down_proj": "Q6_K", "lm_head": "Q6_K"}
"""llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for attn_v, ffn_down and the output."""


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    """The float32 model every GGUF copy is made from."""
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("f32"), PRESET, seed=3))


def type_of(name: str, scheme: str) -> str | None:
    """The GGUF type of tensor ``name`` in a file of ``scheme`` (None: kept as float32)."""
    if not name.endswith(".weight") or "norm" in name:
        return None
    if scheme == "Q4_K_M":
        return next((t for part, t in Q4_K_M.items() if part in name), "Q4_K")
    return scheme


def gguf_weights(local: LocalModel, scheme: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's tensors as a GGUF reader maps them: quantized matrices as uint8 blocks, F16
    ones as float16, norms in float32; and their types."""
    weights, quant_types = {}, {}
    for name, tensor in local.weights.items():
        qtype = type_of(name, scheme)
        if qtype is None:
            weights[name] = tensor
        elif qtype == "F16":
            weights[name] = tensor.half()
        else:
            weights[name] = torch.from_numpy(quantize(tensor.numpy(), qtype))
            quant_types[name] = qtype
    return weights, quant_types


def dequantized(weights: dict[str, torch.Tensor], quant_types: dict[str, str]) -> dict:
    """The float32 values of every tensor (the checkpoint transformers is given)."""
    return {
        name: dequantize_reference(QuantWeight.of(t, quant_types[name], name))
        if name in quant_types
        else t.float()
        for name, t in weights.items()
    }


def dequantized_dir(local: LocalModel, tensors: dict[str, torch.Tensor], out: Path) -> Path:
    model_dir = Path(local.manifest.files[0]).parent
    shutil.copytree(model_dir, out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(
    "scheme", ["Q8_0", "Q4_K_M", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
)
def test_float32_greedy_tokens_equal_transformers_on_the_dequantized_weights(
    local: LocalModel, tmp_path: Path, scheme: str
) -> None:
    weights, quant_types = gguf_weights(local, scheme)
    model = dataclasses.replace(local, weights=weights, quant_types=quant_types)
    prompts = [make_prompt(23, seed=1), make_prompt(5, seed=2)]
    engine, _ = make_engine(model, num_blocks=16, attention_backend="native")
    built = engine.runner.model
    assert isinstance(built.embed_tokens, QuantWeight) and isinstance(built.lm_head, QuantWeight)
    assert built.dtype == torch.float32
    got = generate(engine, prompts, max_new_tokens=12)
    reference = dequantized_dir(local, dequantized(weights, quant_types), tmp_path / "deq")
    assert got == hf_generate(reference, prompts, max_new_tokens=12)


@pytest.mark.parametrize("scheme", ["Q8_0", "Q4_K_M", "F16"])
def test_bfloat16_agrees_with_float32_on_the_dequantized_weights(
    local: LocalModel, native: KernelLoader, scheme: str
) -> None:
    weights, quant_types = gguf_weights(local, scheme)
    bf16_config = dataclasses.replace(local.config, dtype="bfloat16")
    model = LlamaModel(bf16_config, weights, quant_types)
    assert model.dtype == torch.bfloat16
    # F16 matrices of a bfloat16 model are used in place too (F16C widening, no copy)
    assert all(isinstance(w, QuantWeight) for w in model.layers[0].qkv)
    reference = LlamaModel(local.config, dequantized(weights, quant_types))
    tokens = make_prompt(64, seed=4)
    want = model_logits(reference, tokens, native, step_tokens=4)
    for kernels in (native, None):  # the decode kernels and the torch reference
        got = model_logits(model, tokens, kernels, step_tokens=4)
        result = agreement(want, got)
        assert result["argmax_agreement"] >= 0.9, result
        assert result["min_logit_cosine"] >= 0.999, result


def test_tied_lm_head_is_the_quantized_embedding(local: LocalModel, native: KernelLoader) -> None:
    weights, quant_types = gguf_weights(local, "Q4_K_M")
    del weights["lm_head.weight"], quant_types["lm_head.weight"]
    config = dataclasses.replace(local.config, tie_word_embeddings=True)
    model = LlamaModel(config, weights, quant_types)
    assert model.lm_head is model.embed_tokens
    reference = dequantized(weights, quant_types)
    hidden = torch.randn(3, PRESET.hidden_size)
    want = hidden.double() @ reference["model.embed_tokens.weight"].double().T
    for kernels in (native, None):
        logits = model.compute_logits(hidden, kernels)
        assert torch.allclose(logits.double(), want, rtol=1e-5, atol=1e-4)


def test_quantized_matrices_are_views_of_the_mapped_tensors(local: LocalModel) -> None:
    weights, quant_types = gguf_weights(local, "Q4_K_M")
    model = LlamaModel(local.config, weights, quant_types)
    layer = model.layers[1]
    v = layer.qkv[2]
    assert isinstance(v, QuantWeight) and v.qtype.name == "Q6_K" and v.shape == (128, 256)
    assert v.data.data_ptr() == weights["model.layers.1.self_attn.v_proj.weight"].data_ptr()
    assert layer.o_proj.qtype.name == "Q4_K"  # type: ignore[union-attr]


def test_a_tensor_that_is_not_its_types_blocks_is_refused(local: LocalModel) -> None:
    weights, quant_types = gguf_weights(local, "Q8_0")
    name = "model.layers.0.mlp.up_proj.weight"
    weights[name] = weights[name][:, :-1].contiguous()
    with pytest.raises(ValueError, match=f"{name}: rows of 271 bytes are not whole Q8_0 blocks"):
        LlamaModel(local.config, weights, quant_types)
