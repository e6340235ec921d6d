"""The GGUF export of a checkpoint, and (where llama-cpp-python is installed) its exactness against
transformers through llama.cpp."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.llamacpp.gguf_export import GGUF_TENSOR_NAMES, check_exportable, rope_permute
from benchmarks.llamacpp.systems import ZEROLAYER_VARIANTS
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.checkpoints.model_config import ModelConfig

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None,
    reason="gguf (the bench extra) is not installed: pip install 'zerolayer[bench]'",
)
needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None,
    reason="llama-cpp-python and gguf (the bench extra) are not installed: "
    "pip install 'zerolayer[bench]'",
)


def test_rope_permute_interleaves_each_heads_halves() -> None:
    # 2 heads of head_dim 4: HF pairs dims (0, 2), (1, 3) of each head; llama.cpp pairs (0, 1),
    # (2, 3). Row h*4 + 2i + j of the result is row h*4 + j*2 + i of the input.
    weight = torch.arange(8).view(8, 1).repeat(1, 3)
    assert rope_permute(weight, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert rope_permute(weight, 2).shape == (8, 3)


def test_only_configs_gguf_metadata_can_say_are_exported() -> None:
    config = json.loads((ensure_dummy_model("tiny") / "config.json").read_text())
    check_exportable(ModelConfig.from_json(json.dumps(config)))
    check_exportable(ModelConfig.from_json(json.dumps({**config, "mlp_bias": True})))
    scaled = {**config, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    with pytest.raises(ValueError, match="rope scaling type 'dynamic' is not supported"):
        check_exportable(ModelConfig.from_json(json.dumps(scaled)))
    with pytest.raises(ValueError, match="hidden_act 'gelu': GGUF llama has no other"):
        check_exportable(ModelConfig.from_json(json.dumps({**config, "hidden_act": "gelu"})))
    windowed = {
        **config,
        "architectures": ["Qwen2ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 0,
    }
    with pytest.raises(ValueError, match="sliding_window 64: GGUF qwen2 has none"):
        check_exportable(ModelConfig.from_json(json.dumps(windowed)))


@needs_gguf
@pytest.mark.parametrize("gguf_type", ["f32", "bf16", "q8_0"])
def test_export_writes_llama_metadata_tokenizer_and_permuted_weights(
    tmp_path: Path, gguf_type: str
) -> None:
    import gguf
    from safetensors.torch import load_file

    from benchmarks.llamacpp.gguf_export import export_gguf

    model_dir = ensure_dummy_model("tiny")
    reader = gguf.GGUFReader(export_gguf(model_dir, tmp_path / "m.gguf", gguf_type))
    fields = {name: f.contents() for name, f in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert (fields["llama.block_count"], fields["llama.embedding_length"]) == (4, 128)
    assert (fields["llama.attention.head_count"], fields["llama.attention.head_count_kv"]) == (4, 2)
    assert fields["llama.rope.dimension_count"] == 32
    assert fields["tokenizer.ggml.model"] == "gpt2"
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == 259 and tokens[:4] == ["<unk>", "<s>", "</s>", "Ā"]
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (1, 2)
    tensors = {t.name: t for t in reader.tensors}
    per_layer = {f"blk.{i}.{n}.weight" for i in range(4) for n in GGUF_TENSOR_NAMES.values()}
    assert set(tensors) == per_layer | {"token_embd.weight", "output_norm.weight", "output.weight"}
    expected = {"f32": "F32", "bf16": "BF16", "q8_0": "Q8_0"}[gguf_type]
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == expected
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    if gguf_type == "f32":
        hf = load_file(str(model_dir / "model.safetensors"))
        k = np.asarray(tensors["blk.1.attn_k.weight"].data)
        np.testing.assert_array_equal(
            k, rope_permute(hf["model.layers.1.self_attn.k_proj.weight"], 2)
        )
        out = np.asarray(tensors["output.weight"].data)
        np.testing.assert_array_equal(out, hf["lm_head.weight"].numpy())


@needs_llama_cpp
def test_f32_gguf_greedy_ids_and_logits_equal_transformers_fp32(tmp_path: Path) -> None:
    from benchmarks.llamacpp.baselines import repacking_works
    from benchmarks.llamacpp.gguf_exactness import gguf_agreement
    from benchmarks.llamacpp.gguf_export import export_gguf
    from zerolayer.bench.streams import random_prompts

    model_dir = ensure_dummy_model("tiny")
    paths = {t: export_gguf(model_dir, tmp_path / f"{t}.gguf", t) for t in ("f32", "bf16", "q8_0")}
    prompt = random_prompts(1, 32, 259, seed=4242)[0]
    repack = repacking_works(paths["q8_0"], 2)  # see its NOTE: not on this VM's AMX
    result = gguf_agreement(model_dir, paths, prompt, 16, 2, repack)
    f32 = result["f32"]
    assert f32["exact"] is True, f32
    assert (f32["greedy_ids_equal"], f32["first_divergence"]) == (16, None)
    assert f32["teacher_forced_argmax_agreement"] == 1.0
    assert f32["max_abs_logit_diff"] < 1e-2 and f32["min_logit_cosine"] > 0.99999
    for name in ("bf16", "q8_0"):
        assert result[name]["num_tokens"] == 16 and result[name]["min_logit_cosine"] > 0.9


def test_the_llama_cpp_comparison_includes_zerolayers_int8_checkpoint(tmp_path: Path) -> None:
    variants = {v.name: v for v in ZEROLAYER_VARIANTS}
    assert set(variants) == {"zerolayer", "zerolayer int8"}
    model_dir = ensure_dummy_model("tiny")
    assert variants["zerolayer"].checkpoint(model_dir, tmp_path) == model_dir
    int8_dir = variants["zerolayer int8"].checkpoint(model_dir, tmp_path)
    config = json.loads((int8_dir / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 32
