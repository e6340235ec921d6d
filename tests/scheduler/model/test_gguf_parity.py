"""Every family's BF16 GGUF file through the engine (native kernels, in process) against
transformers in bfloat16 on the same weights, as the safetensors checkpoints are checked
(test_family_parity.py: the same greedy ids up to a bfloat16 near-tie), and the pure-torch
prefill logits bit for bit: GGUF's layout changes (llama's permuted q/k rows, Gemma's stored
1 + w, norms in F32) must not move a single rounding; and the fused decode step on llama's
permuted rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_checkpoints import FamilyCheckpoints, hf_greedy
from gguf_files import GGUF_FAMILIES, GGUF_FAMILY_CHANGES, family_gguf
from test_decode_forward import assert_fused_steps_match
from test_family_parity import (
    FAMILY_NEW_TOKENS,
    assert_greedy_ids_up_to_ties,
    greedy_ids,
    native_engine,
    prefill_logits,
)
from test_llama_parity import make_prompts

from benchmarks.llamacpp.gguf_export import export_gguf
from zerolayer.bench.inprocess import LocalModel
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.llama import LlamaModel


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_a_families_bf16_file_matches_transformers_bfloat16(
    family: str, family_checkpoints: FamilyCheckpoints, tmp_path: Path
) -> None:
    prompts = make_prompts()
    if family in GGUF_FAMILY_CHANGES:
        model_dir, path = family_gguf(tmp_path, family, "bfloat16", "bf16")
        reference = hf_greedy(model_dir, prompts, FAMILY_NEW_TOKENS)
    else:  # the safetensors parity test's checkpoint and reference, shared in the session
        model_dir = family_checkpoints.model_dir(family, "bfloat16")
        reference = family_checkpoints.reference(family, "bfloat16")
        path = export_gguf(model_dir, tmp_path / f"{family}.gguf", "bf16")
    assert_greedy_ids_up_to_ties(greedy_ids(native_engine(path), prompts), reference)
    torch.testing.assert_close(
        prefill_logits(path, prompts[0]), prefill_logits(model_dir, prompts[0]), rtol=0, atol=0
    )


@pytest.mark.parametrize("gguf_type", ["bf16", "q8_0"])
def test_the_fused_decode_step_maps_llamas_interleaved_rows(
    tmp_path: Path, native: KernelLoader, gguf_type: str
) -> None:
    # mistral's GGUF architecture is llama: q/k rows in llama.cpp's layout, mapped back to
    # rotate-half inside the fused step as the layer-by-layer forward does after the matmul
    _, path = family_gguf(tmp_path, "mistral", "bfloat16", gguf_type)
    local = LocalModel.load(path)
    assert local.config.qk_rows_interleaved
    fused = LlamaModel(local.config, local.weights, local.quant_types)
    plain = LlamaModel(local.config, local.weights, local.quant_types)
    plain._fused_decode_checked = True  # never builds the fused step
    assert_fused_steps_match(native, fused, plain, num_seqs=2)
