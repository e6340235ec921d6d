"""Tiny random checkpoints of every served family, written by transformers, and transformers'
greedy answers on them: the factories of the family parity tests.

The recipe is issue 29's (where a bfloat16 Mistral checkpoint was served with other greedy tokens
than transformers gives): each family's config class with its defaults but 2 layers, hidden 64,
intermediate 128, 4 heads, 2 KV heads, head_dim 16, 256 positions, vocab 32000; matrices drawn with
std 1/sqrt(fan-in) and embeddings with std 1, so that activations are O(1) in every layer and a
bfloat16 rounding that transformers does not do moves logits by about one bfloat16 ulp, enough to
flip near-ties among 32000 candidates. Biases are drawn with the std of their matrix and norm
weights around their identity (1, or 0 for Gemma's 1 + w), since transformers' zeros and ones
would hide a missing bias or norm. A family's bfloat16 checkpoint is its float32 one rounded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer

TINY = {
    "vocab_size": 32000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
FAMILIES: dict[str, tuple[str, dict]] = {
    # Llama with every bias, a head_dim other than hidden_size / num_attention_heads and a GELU.
    "llama-bias": (
        "LlamaConfig",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "head_dim": 24,
            "hidden_act": "gelu_pytorch_tanh",
        },
    ),
    # SmolLM2 and Llama 3.2: Llama with tied embeddings (and Llama 3.2's llama3 RoPE).
    "llama-tied": (
        "LlamaConfig",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
    "phi3": ("Phi3Config", {"sliding_window": None}),
    # Issue 29's checkpoint: MistralConfig's defaults (sliding_window 4096, rope_theta 10000).
    "mistral": ("MistralConfig", {"sliding_window": 4096}),
    # Gemma's legacy hidden_act "gelu" (gelu_pytorch_tanh, as transformers reads it) is written
    # into config.json by write_family_checkpoint, as the published Gemma 1 configs have it.
    "gemma": ("GemmaConfig", {"attention_bias": True}),
    # Gemma 2: query_pre_attn_scalar != head_dim, soft-caps small enough to bend the scores, and
    # a window of 16 tokens on layer 0 that prompts and generations outgrow.
    "gemma2": (
        "Gemma2Config",
        {
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
            "sliding_window": 16,
            "tie_word_embeddings": False,
        },
    ),
}
"""Per family: the name of its transformers config class and the fields that differ from TINY."""
GEMMA_FAMILIES = ("gemma", "gemma2")
"""Families whose RMSNorm multiplies by 1 + w (norm weights drawn around 0)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FAMILY_NEW_TOKENS = 14
"""Greedy tokens generated per prompt: the prompts of test_llama_parity.make_prompts (3 to 17
tokens) then reach 17 to 31 positions, each past Gemma 2's window of 16, over several KV blocks."""


def draw_parameters(model: torch.nn.Module, family: str, seed: int) -> None:
    """Redraws every parameter of ``model`` in place with the recipe (module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if "norm" in name:
                centre = 0.0 if family in GEMMA_FAMILIES else 1.0
                param.copy_(centre - 0.5 + torch.rand(param.shape, generator=generator))
                continue
            if "embed_tokens" in name:
                std = 1.0
            else:
                # A bias has the std of its matrix's entries: 1 / sqrt(fan-in).
                weight = params[name.removesuffix(".bias") + ".weight"] if "bias" in name else param
                std = 1.0 / math.sqrt(weight.shape[1])
            param.copy_(torch.randn(param.shape, generator=generator) * std)


def write_family_checkpoint(
    out_dir: Path, family: str, dtype: str, seed: int, **changes: object
) -> Path:
    """Saves the seeded random ``family`` model in ``dtype`` ("float32" or "bfloat16", the same
    draw rounded) with safetensors and a byte-level tokenizer, as transformers writes it;
    ``changes`` override config fields."""
    config_class, fields = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**TINY, **fields, **changes})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    draw_parameters(model, family, seed)
    model.to(DTYPES[dtype]).save_pretrained(out_dir)
    if family == "gemma":
        config_path = out_dir / "config.json"
        saved = json.loads(config_path.read_text())
        saved["hidden_act"] = "gelu"
        config_path.write_text(json.dumps(saved))
    write_byte_level_tokenizer(out_dir, TINY["max_position_embeddings"])
    return out_dir


@dataclass(frozen=True)
class GreedyReference:
    """transformers' greedy continuation of each prompt, and the float32 logits that judge a
    near-tie along it."""

    token_ids: list[list[int]]
    """Per prompt: transformers' greedy ids in the checkpoint's dtype."""
    float32_logits: list[torch.Tensor]
    """Per prompt: float32 [len(token_ids), vocab] logits of the model upcast to float32,
    teacher-forced along ``token_ids`` (row t is what predicts token t)."""


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> GreedyReference:
    """transformers' greedy decode of the prompts, batched, in the checkpoint's dtype (no EOS);
    for a bfloat16 checkpoint then one teacher-forced forward of each prompt and its answer
    through the model upcast to float32 (a float32 checkpoint's decode logits are those).

    The decode is ``generate``'s greedy loop written out: the prompts left-padded, positions
    counted from each prompt's first token, one forward per step with a ``DynamicCache`` and
    ``logits_to_keep=1``, argmax. It gives ``generate``'s ids one prompt at a time (checked on
    every family here in float32) in a tenth of its time on these tiny models.
    """
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    width = max(map(len, prompts))
    step_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = transformers.DynamicCache(config=hf.config)
    new_ids, step_logits = [], []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = hf(
                step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                logits_to_keep=1,
            ).logits[:, -1]
            step_ids = logits.argmax(-1, keepdim=True)
            new_ids.append(step_ids)
            step_logits.append(logits.float())
            mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
            positions = positions[:, -1:] + 1
        token_ids = torch.cat(new_ids, dim=1).tolist()
        if hf.dtype == torch.float32:
            return GreedyReference(token_ids, list(torch.stack(step_logits, dim=1)))
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        logits = [
            hf32(torch.tensor([p + ids[:-1]])).logits[0, len(p) - 1 :].float()
            for p, ids in zip(prompts, token_ids, strict=True)
        ]
    return GreedyReference(token_ids, logits)


class FamilyCheckpoints:
    """Each (family, dtype)'s checkpoint and transformers' greedy reference on ``prompts``, made
    on first use and kept (one per test session: the writes and references are most of the family
    tests' time)."""

    def __init__(self, root: Path, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.root = root
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self._dirs: dict[tuple[str, str], Path] = {}
        self._references: dict[tuple[str, str], GreedyReference] = {}

    def model_dir(self, family: str, dtype: str) -> Path:
        """The directory of ``family`` in ``dtype`` (seed: the family's place in FAMILIES)."""
        key = (family, dtype)
        if key not in self._dirs:
            seed = sorted(FAMILIES).index(family)
            self._dirs[key] = write_family_checkpoint(
                self.root / f"{family}-{dtype}", family, dtype, seed
            )
        return self._dirs[key]

    def reference(self, family: str, dtype: str) -> GreedyReference:
        """transformers' greedy reference of the prompts on :meth:`model_dir`."""
        key = (family, dtype)
        if key not in self._references:
            model_dir = self.model_dir(family, dtype)
            self._references[key] = hf_greedy(model_dir, self.prompts, self.max_new_tokens)
        return self._references[key]
