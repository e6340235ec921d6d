"""Parity of every served family with transformers, in float32 and in bfloat16, on tiny random
checkpoints transformers writes (issue 29's recipe, :mod:`family_checkpoints`): greedy ids of four
prompts through the whole engine (chunked prefill, paged KV, decode batches), and the logits of
one prefill of our forward.

Both dtypes run the engine with the native CPU kernels (what ``zerolayer up`` serves; Gemma 2's
attention runs the reference whatever the backend) and check the pure-torch forward's prefill; the
reference attention through the whole engine is test_llama_parity.py's. float32 is exact: the same
greedy ids, and prefill logits within 1e-4. bfloat16 is where rounding shows, so it is checked in
two parts:

- The pure-torch forward's prefill logits equal transformers' bit for bit. Both run the same
  torch ops in the same dtypes, so any deviation (a norm, bias or RoPE computed in another dtype
  or order, a wrong config default) is a failure, however small.
- The engine gives transformers' greedy ids up to a near-tie. Its kernels sum in other orders
  than torch (GEMVs, norms, attention), and the engine's batches and prefill chunks give torch's
  GEMMs other shapes, so a logit can move by a bfloat16 rounding, and among 32000 candidates two
  are sometimes that close. A request may therefore part from transformers' ids at one step t,
  but only where the float32 (upcast) logits of the two tokens differ by at most TIE_ULPS
  bfloat16 ulps at their magnitude (the resolution of a bfloat16 logit); its continuation is then
  another text and is not compared. Any other difference fails, and so do parted requests that
  match on fewer than MIN_MATCHED of all tokens. A real error (a missing bias or norm, a wrong
  default, RoPE theta or activation) moves logits by far more than two ulps, so it fails at the
  first token it changes. (On this machine no request parts; with the attention before issue
  29's fix, 4 of the 32 did, each within a tie.)

What the tie rule cannot tell apart from rounding, a systematic rounding that transformers does not
do, is checked where it is exact: :func:`test_issue_29_mistral_first_token` (the issue's case) and
the kernel's own comparison with torch's attention (test_paged_attention_kernel.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from family_checkpoints import (
    DTYPES,
    FAMILIES,
    FAMILY_NEW_TOKENS,
    FamilyCheckpoints,
    GreedyReference,
)
from safetensors.torch import load_file, save_file
from test_llama_parity import BLOCK_SIZE, make_engine, make_prompts, run_engine
from transformers.activations import ACT2FN

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.bench.logit_agreement import chunked_logits
from zerolayer.checkpoints.config_fields import HIDDEN_ACTS
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.engine_factory import EngineConfig
from zerolayer.scheduler.model.llama import ACTIVATIONS

LOGIT_ATOL = 1e-4
"""float32 prefill logits against transformers'."""
TIE_ULPS = 2
"""A bfloat16 greedy run may part from transformers' where the float32 logits of the two tokens
are at most this many bfloat16 ulps apart."""
MIN_MATCHED = 0.5
"""Fraction of all generated tokens that must match before the requests part (bfloat16)."""
FAMILY_DTYPES = [(f, d) for f in sorted(FAMILIES) for d in DTYPES]


def prefill_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """float32 [len(prompt), vocab] logits of one prefill of our forward (pure torch; KV caches
    in the model's dtype)."""
    return chunked_logits(model_dir, prompt, None, len(prompt), BLOCK_SIZE)


def native_engine(model_dir: Path) -> Engine:
    """The engine with the native CPU kernels (attention, GEMV, norms, fused decode), over an
    in-process arena of 64 blocks."""
    model = LocalModel.load(model_dir)
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, attention_backend="native")
    engine, _ = build_local_engine(model, config, model.arena_layout_of_blocks(BLOCK_SIZE, 64))
    return engine


def greedy_ids(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """The engine's FAMILY_NEW_TOKENS greedy ids of each prompt."""
    outputs = run_engine(engine, prompts, FAMILY_NEW_TOKENS)
    return [[t for r in outputs[str(i)] for t in r.new_token_ids] for i in range(len(prompts))]


def assert_greedy_ids(engine: Engine, prompts: list[list[int]], expected: list[list[int]]) -> None:
    """The engine's greedy ids equal ``expected`` exactly."""
    for i, (ids, reference) in enumerate(zip(greedy_ids(engine, prompts), expected, strict=True)):
        assert ids == reference, f"prompt {i}"


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 values (8 significant bits) at magnitude ``x``."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 2.0**-126))) - 7)


def assert_greedy_ids_up_to_ties(
    ids: list[list[int]], reference: GreedyReference, tie_ulps: int = TIE_ULPS
) -> None:
    """Each request's ids equal transformers' until they part at a near-tie (module docstring).

    Raises:
        AssertionError: a request parts where the float32 logit of transformers' token beats
            ours by more than ``tie_ulps`` ulps, or fewer than MIN_MATCHED of all tokens match.
    """
    matched = total = 0
    for i, (ours, theirs) in enumerate(zip(ids, reference.token_ids, strict=True)):
        total += len(theirs)
        t = next((t for t, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
        matched += len(theirs) if t is None else t
        if t is None:
            continue
        row = reference.float32_logits[i][t]
        theirs_logit, ours_logit = float(row[theirs[t]]), float(row[ours[t]])
        tie = tie_ulps * bf16_ulp(max(abs(theirs_logit), abs(ours_logit)))
        assert theirs_logit - ours_logit <= tie, (
            f"prompt {i} token {t}: {ours[t]} (float32 logit {ours_logit:.4f}) where transformers "
            f"gives {theirs[t]} ({theirs_logit:.4f}): more than a bfloat16 near-tie ({tie:.4f})"
        )
    assert matched >= MIN_MATCHED * total, f"{matched} of {total} tokens before the runs part"


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts()


@pytest.mark.parametrize(("family", "dtype"), FAMILY_DTYPES)
def test_family_matches_transformers(
    family: str, dtype: str, family_checkpoints: FamilyCheckpoints, prompts: list[list[int]]
) -> None:
    model_dir = family_checkpoints.model_dir(family, dtype)
    reference = family_checkpoints.reference(family, dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert hf.dtype == DTYPES[dtype]
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0].float()
    logits = prefill_logits(model_dir, prompts[1])
    engine = native_engine(model_dir)
    # Gemma 2's soft-capped, windowed attention runs the reference whatever the backend.
    backend = "reference" if family == "gemma2" else "native"
    if dtype == "float32":
        torch.testing.assert_close(logits, reference_logits, atol=LOGIT_ATOL, rtol=0)
        assert_greedy_ids(engine, prompts, reference.token_ids)
    else:
        torch.testing.assert_close(logits, reference_logits, atol=0, rtol=0)
        assert_greedy_ids_up_to_ties(greedy_ids(engine, prompts), reference)
    assert engine.stats().attention_backend == backend


def test_issue_29_mistral_first_token(family_checkpoints: FamilyCheckpoints) -> None:
    """Issue 29: the bfloat16 Mistral checkpoint was served a first token that transformers gives
    neither in bfloat16 nor in float32. The native attention multiplied V by float32 softmax
    weights where torch rounds them to bfloat16 first, which moved about a quarter of its outputs
    by a bfloat16 ulp. On this prompt transformers' 26906 leads 14777 by 0.032 in float32, and
    its bfloat16 logits are 4.0625 and 4.03125; the served path had both at 4.03125 and took
    14777. (Of the first tokens of 400 prompts on this checkpoint, 7 differed from transformers'
    then, 3 of them where transformers' bfloat16 and float32 agree; 1 differs with torch's
    rounding, toward float32's token.) A lead of a whole ulp survives the roundings transformers
    does; only another rounding ties it."""
    model_dir = family_checkpoints.model_dir("mistral", "bfloat16")
    prompt = [10, 38, 247, 22, 226, 254, 191, 147, 197, 244, 213, 169, 23, 242]
    first = {}
    for dtype in DTYPES.values():
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        with torch.inference_mode():
            first[dtype] = int(hf(torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].argmax())
    assert first[torch.bfloat16] == first[torch.float32] == 26906
    outputs = run_engine(native_engine(model_dir), [prompt], 1)
    assert list(outputs["0"][0].new_token_ids) == [26906]


def test_family_options_are_parsed(family_checkpoints: FamilyCheckpoints) -> None:
    configs = {
        family: ModelConfig.from_json(
            (family_checkpoints.model_dir(family, "float32") / "config.json").read_text()
        )
        for family in ("llama-bias", "llama-tied", "qwen2", "qwen3", "phi3", "mistral")
    }
    assert configs["llama-bias"].qkv_bias and configs["llama-bias"].o_bias
    assert configs["llama-bias"].mlp_bias and configs["llama-bias"].head_dim == 24
    assert configs["qwen2"].qkv_bias and not configs["qwen2"].o_bias
    assert configs["qwen3"].qk_norm and configs["qwen3"].head_dim == 32
    assert configs["phi3"].fused_projections
    # MistralConfig's default window: longer than max_position_embeddings, so never capping.
    assert configs["mistral"].sliding_window == 4096 and configs["mistral"].rope.theta == 10000
    assert configs["mistral"].max_model_len == configs["phi3"].max_model_len == 256
    assert all(configs[f].tie_word_embeddings for f in ("llama-tied", "qwen2", "qwen3"))


def write_mixed_dtype_model(source: Path, out_dir: Path) -> Path:
    """The float32 checkpoint ``source`` in bfloat16 with its norm weights and biases kept in
    float32 (as some exports store them); config.json says bfloat16, as transformers'
    save_pretrained writes."""
    out_dir.mkdir()
    for path in source.iterdir():
        (out_dir / path.name).write_bytes(path.read_bytes())
    weights_path = out_dir / "model.safetensors"
    tensors = {
        name: t if t.dim() == 1 else t.to(torch.bfloat16)
        for name, t in load_file(weights_path).items()
    }
    save_file(tensors, str(weights_path), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def test_float32_vectors_in_bfloat16_checkpoint_compute_as_transformers(
    tmp_path: Path, family_checkpoints: FamilyCheckpoints, prompts: list[list[int]]
) -> None:
    """transformers' dtype="auto" casts the float32 vectors to bfloat16 at load; zerolayer casts
    them per use, which rounds the same (the issue's crash: float32 norms in a bf16 forward)."""
    source = family_checkpoints.model_dir("llama-bias", "float32")
    model_dir = write_mixed_dtype_model(source, tmp_path / "mixed")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert hf.model.norm.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0].float()
    logits = prefill_logits(model_dir, prompts[1])
    # NOTE: exact: biases are added inside the matmul (one rounding), as nn.Linear does; added
    # after a rounded product they moved these logits by about 0.07.
    torch.testing.assert_close(logits, reference_logits, atol=0, rtol=0)
    engine, _ = make_engine(model_dir, 64, 8)
    assert all(len(ids) > 0 for ids in greedy_ids(engine, prompts))


@pytest.mark.parametrize("name", HIDDEN_ACTS)
def test_activations_are_transformers_activations(name: str) -> None:
    x = torch.linspace(-6.0, 6.0, 1001)
    assert torch.equal(ACTIVATIONS[name](x), ACT2FN[name](x))


def test_a_tied_model_with_its_own_lm_head_uses_it_as_transformers_does(
    tmp_path: Path, family_checkpoints: FamilyCheckpoints, prompts: list[list[int]]
) -> None:
    """tie_word_embeddings with an lm_head.weight of other values in the checkpoint: transformers
    5 "will NOT tie them" and computes the logits with lm_head.weight; so does zerolayer."""
    source = family_checkpoints.model_dir("llama-tied", "float32")
    model_dir = tmp_path / "tied-own-head"
    model_dir.mkdir()
    for path in source.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    tensors = load_file(model_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(5)
    embed = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = torch.randn(embed.shape, generator=generator) * 0.125
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    with torch.inference_mode():
        reference_logits = hf(torch.tensor([prompts[1]])).logits[0]
    logits = prefill_logits(model_dir, prompts[1])
    torch.testing.assert_close(logits, reference_logits, atol=LOGIT_ATOL, rtol=0)
