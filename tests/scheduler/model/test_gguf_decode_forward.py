"""The fused decode step (csrc/decode_forward.cpp) over GGUF weights, each matrix of its own type,
against the layer-by-layer forward it replaces, and with q/k rows in llama.cpp's interleaved
rotary layout mapped back inside the step."""

from __future__ import annotations

import dataclasses

import pytest
from test_decode_forward import assert_fused_steps_match
from test_gguf_model import PRESET, gguf_weights

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import write_dummy_model
from zerolayer.scheduler.model.decode_forward import FusedDecode
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("f32"), PRESET, seed=5))


def bf16_model(local: LocalModel, scheme: str, fused: bool) -> LlamaModel:
    weights, quant_types = gguf_weights(local, scheme)
    model = LlamaModel(dataclasses.replace(local.config, dtype="bfloat16"), weights, quant_types)
    model._fused_decode_checked = not fused  # True: never builds the fused step
    return model


def llama_cpp_rows(weight: QuantWeight, head_dim: int) -> QuantWeight:
    """q or k rows reordered as convert_hf_to_gguf writes a llama file's: per head, rotate-half
    row half * D/2 + i at 2i + half (the blocks of a row move with it)."""
    n = weight.shape[0]
    data = weight.data.reshape(n // head_dim, 2, head_dim // 2, -1).transpose(1, 2)
    return QuantWeight(data.reshape(weight.data.shape).contiguous(), weight.qtype, weight.shape)


@pytest.mark.parametrize("num_seqs", [1, 3, 4])
@pytest.mark.parametrize("scheme", ["Q4_K_M", "Q8_0", "Q5_1", "F16"])
def test_fused_gguf_steps_match_the_layer_by_layer_forward(
    native: KernelLoader, local: LocalModel, scheme: str, num_seqs: int
) -> None:
    fused, plain = bf16_model(local, scheme, True), bf16_model(local, scheme, False)
    assert_fused_steps_match(native, fused, plain, num_seqs)


@pytest.mark.parametrize("num_seqs", [1, 2])
def test_llama_cpp_qk_rows_are_mapped_back_inside_the_step(
    native: KernelLoader, local: LocalModel, num_seqs: int
) -> None:
    plain = bf16_model(local, "Q4_K_M", False)
    fused = bf16_model(local, "Q4_K_M", True)
    d = PRESET.hidden_size // PRESET.num_attention_heads
    fused.layers = [
        dataclasses.replace(
            layer,
            qkv=(llama_cpp_rows(layer.qkv[0], d), llama_cpp_rows(layer.qkv[1], d), layer.qkv[2]),
        )
        for layer in fused.layers
    ]
    module = native.load()
    fused._fused_decode = FusedDecode(
        module, fused.config, fused.layers, fused.norm, fused.scale, qk_rows_interleaved=True
    )
    fused._fused_decode_checked = True
    assert_fused_steps_match(native, fused, plain, num_seqs)
    # without the mapping, the same rows give other keys
    fused._fused_decode = FusedDecode(
        module, fused.config, fused.layers, fused.norm, fused.scale, False
    )
    with pytest.raises(AssertionError):
        assert_fused_steps_match(native, fused, plain, num_seqs)


def test_a_gguf_model_runs_fused(local: LocalModel, native: KernelLoader, caplog) -> None:
    model = bf16_model(local, "Q4_K_M", True)
    with caplog.at_level("INFO"):
        assert model._fused_decode_for(native) is not None
    assert "decode steps of up to 4 sequences run fused" in caplog.text
