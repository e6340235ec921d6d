"""Quality of a GGUF file served by zerolayer, against llama.cpp on the same file and against
the float model the file was made from (issue 32, item 3).

Two measures, each on token ids that every system gets alike:

- the **mean log-likelihood** of a fixed token sequence, teacher-forced: the mean over positions
  1..n-1 of ``log p(token_i | tokens before it)`` (natural log; its negative is the log of the
  perplexity). zerolayer's comes through the four layers (``prompt_logprobs`` of a Generate
  call), llama.cpp's from its logits at every position of one prefill, the float model's from
  transformers in float32;
- the **greedy tokens** of a set of prompts: per prompt, how many of the first ``num_tokens``
  greedy ids two systems share before they first part, and how many are equal position by
  position.

Source: llama.cpp's ``tools/perplexity`` computes the same mean over a text's tokens (it scores
only the second half of each window; here every position after the first counts, for every
system alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zerolayer.bench.common import stub_for
from zerolayer.v1 import generation_pb2 as pb


def mean_loglik_from_logits(logits: np.ndarray, token_ids: Sequence[int]) -> float:
    """Mean of ``log_softmax(logits[i - 1])[token_ids[i]]`` over i in 1..n-1.

    Args:
        logits: float32 ``[n, vocab]``, row i predicting token i + 1 (the last row is unused).
        token_ids: the n scored ids.

    Raises:
        ValueError: fewer than 2 ids, or rows that do not match them.
    """
    n = len(token_ids)
    if n < 2 or logits.shape[0] < n - 1:
        raise ValueError(f"{n} ids and {logits.shape[0]} rows of logits: nothing to score")
    rows = logits[: n - 1].astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    chosen = rows[np.arange(n - 1), np.asarray(token_ids[1:])]
    return float((chosen - log_z).mean())


def zerolayer_mean_loglik(address: str, token_ids: Sequence[int]) -> float:
    """The mean log-likelihood of ``token_ids`` through zerolayer's public gRPC endpoint: one
    unary Generate with ``prompt_logprobs`` (which computes the whole prompt: no prefix-cache
    reuse) and one new token.

    Raises:
        grpc.RpcError: the call failed.
    """
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=list(token_ids)),
        max_new_tokens=1,
        ignore_eos=True,
        prompt_logprobs=0,
    )
    response = stub_for(address).Generate(request, timeout=600)
    values = [entry.chosen.logprob for entry in response.prompt_logprobs]
    if len(values) != len(token_ids) - 1:
        raise RuntimeError(f"{len(values)} prompt logprobs for {len(token_ids)} prompt tokens")
    return float(np.mean(values))


def zerolayer_greedy(address: str, prompt: Sequence[int], num_tokens: int) -> list[int]:
    """zerolayer's greedy ids for ``prompt`` (EOS ignored), through the public endpoint."""
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=list(prompt)),
        max_new_tokens=num_tokens,
        ignore_eos=True,
    )
    return list(stub_for(address).Generate(request, timeout=600).token_ids)


def hf_mean_loglik(model_dir: Path, token_ids: Sequence[int]) -> float:
    """The mean log-likelihood of ``token_ids`` under transformers in float32 on the float
    checkpoint ``model_dir`` (the model a GGUF file was made from)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([list(token_ids)])).logits[0]
    return mean_loglik_from_logits(logits.float().numpy(), token_ids)


def greedy_agreement(ids: Sequence[int], reference: Sequence[int]) -> dict:
    """How two greedy runs of one prompt agree: the shared prefix and the equal positions."""
    pairs = list(zip(ids, reference, strict=True))
    prefix = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
    return {
        "num_tokens": len(pairs),
        "shared_prefix": prefix,
        "equal_positions": sum(a == b for a, b in pairs),
    }


def relative_difference(value: float, reference: float) -> float:
    """``|value - reference| / |reference|`` (issue 32: "within 0.5%")."""
    return abs(value - reference) / abs(reference)


def zerolayer_tokenize(address: str, text: str) -> list[int]:
    """``text``'s ids by the served model's own tokenizer (the GGUF file's, converted), with
    its special tokens (BOS) as a text prompt gets them."""
    request = pb.TokenizeRequest(text=text, add_special_tokens=True)
    return list(stub_for(address).Tokenize(request, timeout=60).token_ids)


QUALITY_TEXT = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tree. She wanted to play "
    "with it, but it was too high. Lily asked her mom for help. Her mom smiled and said, "
    '"Let\'s get it together." They found a long stick and pushed the ball down. Lily was so '
    "happy. She said thank you to her mom and played with the ball all day. When the sun went "
    "down, they walked home and had a warm dinner. Lily went to bed and dreamed of the park."
)
"""The fixed text whose mean log-likelihood is measured (a children's story, the register of
the trained stories260K; for the random-weight presets its ids only fix the positions)."""
