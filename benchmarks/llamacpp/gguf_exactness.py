"""Is llama.cpp running the same model? Its greedy tokens and logits against transformers'.

The reference is transformers in float32 on the original checkpoint. An F32 GGUF must give the
same greedy ids and logits within float rounding (the conversion is exact); BF16 and Q8_0 GGUFs
are reported as they agree (teacher-forced argmax agreement and logit cosine on llama.cpp's own
tokens, as the int8 work of issue 18 measures agreement).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from benchmarks.llamacpp.engine import LlamaCppConfig, LlamaCppModel

EXACTNESS_PROMPT_SEED = 4242
"""Seed of the fixed prompt of the check (:func:`zerolayer.bench.streams.random_prompts`)."""
EXACT_MAX_ABS_LOGIT_DIFF = 1e-2
"""Largest |logit difference| an exact (F32) conversion may show: float32 rounding of two
different kernels over a few layers, far below the gaps between a random model's top logits."""


@torch.inference_mode()
def hf_fp32_reference(
    model_dir: Path, prompt: Sequence[int], num_tokens: int
) -> tuple[list[int], object]:
    """transformers' float32 greedy ids for ``prompt`` and the model itself (for teacher-forced
    logits, see :func:`hf_logits_along`)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    input_ids = torch.tensor([list(prompt)])
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=num_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist(), model


@torch.inference_mode()
def hf_logits_along(model: object, prompt: Sequence[int], token_ids: Sequence[int]) -> np.ndarray:
    """float32 ``[len(token_ids), vocab]``: the logits transformers predicts each of
    ``token_ids`` from, given ``prompt`` and the ids before it (teacher forcing)."""
    ids = torch.tensor([[*prompt, *token_ids[:-1]]])
    logits = model(ids).logits[0, len(prompt) - 1 :]
    return logits.float().numpy()


def agreement(
    ids: Sequence[int], logits: np.ndarray, ref_ids: Sequence[int], ref_logits: np.ndarray
) -> dict:
    """How llama.cpp's greedy ``ids`` (chosen from ``logits``) agree with the reference's greedy
    ``ref_ids``; ``ref_logits`` are the reference's logits along ``ids`` (same shape as
    ``logits``)."""
    prefix = next((i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=True)) if a != b), None)
    cos = (logits * ref_logits).sum(1) / (
        np.linalg.norm(logits, axis=1) * np.linalg.norm(ref_logits, axis=1)
    )
    return {
        "greedy_ids_equal": sum(a == b for a, b in zip(ids, ref_ids, strict=True)),
        "num_tokens": len(ids),
        "first_divergence": prefix,
        "teacher_forced_argmax_agreement": float((ref_logits.argmax(1) == np.asarray(ids)).mean()),
        "max_abs_logit_diff": float(np.abs(logits - ref_logits).max()),
        "min_logit_cosine": float(cos.min()),
    }


def gguf_agreement(
    model_dir: Path,
    gguf_paths: dict[str, Path],
    prompt: Sequence[int],
    num_tokens: int,
    num_threads: int,
    repack: bool = True,
) -> dict:
    """Per GGUF (named by its weight type): :func:`agreement` of llama.cpp's greedy run of
    ``prompt`` for ``num_tokens`` tokens with transformers float32 on ``model_dir``; the F32
    file's entry adds ``exact``: every greedy id equal and logits within
    :data:`EXACT_MAX_ABS_LOGIT_DIFF`. ``repack``: llama.cpp's weight repacking
    (:class:`~benchmarks.llamacpp.engine.LlamaCppConfig`'s ``extra_buffer_types``).

    Raises:
        ImportError: llama-cpp-python or transformers is not installed.
    """
    ref_ids, model = hf_fp32_reference(model_dir, prompt, num_tokens)
    config = LlamaCppConfig(num_threads, 1, len(prompt) + num_tokens, extra_buffer_types=repack)
    out = {}
    for name, path in gguf_paths.items():
        with LlamaCppModel(path, config) as llm:
            run = llm.greedy([prompt], num_tokens, keep_logits=True)
        ids = run.token_ids[0]
        out[name] = agreement(
            ids, run.first_seq_logits, ref_ids, hf_logits_along(model, prompt, ids)
        )
        if name == "f32":
            out[name]["exact"] = (
                out[name]["greedy_ids_equal"] == num_tokens
                and out[name]["max_abs_logit_diff"] <= EXACT_MAX_ABS_LOGIT_DIFF
            )
    return {"reference": "transformers float32", "prompt_tokens": len(prompt), **out}
