"""Logits processors of the sampling controls, applied to a whole batch at once.

Order, each on the previous one's output (float32 [B, V] logits of the rows that sample):

1. ``logit_bias``: added to the raw logits.
2. ``min_new_tokens``: while a row's output is shorter, its EOS ids (unless it ignores EOS) and
   its ``stop_token_ids`` are -inf.
3. ``repetition_penalty`` over prompt and output tokens (Keskar et al. 2019, CTRL,
   arXiv:1909.05858, as transformers' ``RepetitionPenaltyLogitsProcessor``: a negative logit is
   multiplied by the penalty, any other divided).
4. ``presence_penalty`` and ``frequency_penalty`` over output tokens (OpenAI's semantics:
   ``logit -= presence * (count > 0) + frequency * count``).

Then, elsewhere: the structured-output mask, and in :class:`Sampler` temperature, top-k, top-p,
``min_p`` (:func:`apply_min_p`) and the draw. Greedy rows take the argmax of the processed logits.

Each step builds the [B, V] tensors it needs (token counts by ``scatter_add`` over padded
[B, L] id tensors); the only Python loops are over rows and their token lists, never over the
vocabulary. Rows without any control are not touched (a batch without any keeps its tensor).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from zerolayer.scheduler.core.request import Request


def needs_processing(request: Request) -> bool:
    """True when any control of this module is set for the request's next token."""
    s = request.sampling
    return bool(
        s.logit_bias
        or s.repetition_penalty != 1.0
        or s.presence_penalty
        or s.frequency_penalty
        or min_new_tokens_blocks(request)
    )


def min_new_tokens_blocks(request: Request) -> bool:
    """True while ``min_new_tokens`` still blocks EOS and the stop ids of the next token."""
    return len(request.output_token_ids) < request.min_new_tokens


def apply_logits_processors(
    logits: torch.Tensor, requests: Sequence[Request], eos_token_ids: Collection[int]
) -> torch.Tensor:
    """Applies every request's controls to its row, in the module's order.

    Args:
        logits: float32 [B, V] raw logits, row i for ``requests[i]``; not modified.
        requests: the B requests that sample, their output so far without the token sampled now.
        eos_token_ids: the model's EOS ids (masked by ``min_new_tokens``).

    Returns:
        ``logits`` itself when no row has a control; else a new float32 [B, V] tensor on the
        same device.
    """
    rows = [i for i, r in enumerate(requests) if needs_processing(r)]
    if not rows:
        return logits
    chosen = [requests[i] for i in rows]
    device = logits.device
    index = torch.tensor(rows, device=device)
    selected = logits.index_select(0, index)
    vocab = logits.shape[-1]
    apply_logit_bias(selected, *_bias_entries(chosen, device))
    apply_min_new_tokens(selected, *_blocked_entries(chosen, eos_token_ids, device))
    # NOTE: the checks read the parameters on the host (no device sync).
    sampling = [r.sampling for r in chosen]
    if any(s.repetition_penalty != 1.0 for s in sampling):
        repetition = torch.tensor([s.repetition_penalty for s in sampling], device=device)
        seen = token_counts([r.all_token_ids for r in chosen], vocab, device) > 0
        selected = apply_repetition_penalty(selected, seen, repetition)
    if any(s.presence_penalty or s.frequency_penalty for s in sampling):
        presence = torch.tensor([s.presence_penalty for s in sampling], device=device)
        frequency = torch.tensor([s.frequency_penalty for s in sampling], device=device)
        counts = token_counts([r.output_token_ids for r in chosen], vocab, device)
        selected = apply_presence_frequency(selected, counts, presence, frequency)
    return logits.index_put((index,), selected)


def _bias_entries(
    requests: Sequence[Request], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [i for i, r in enumerate(requests) for _ in r.sampling.logit_bias]
    ids = [t for r in requests for t, _ in r.sampling.logit_bias]
    values = [v for r in requests for _, v in r.sampling.logit_bias]
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(ids, dtype=torch.int64, device=device),
        torch.tensor(values, dtype=torch.float32, device=device),
    )


def _blocked_entries(
    requests: Sequence[Request], eos_token_ids: Collection[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    rows: list[int] = []
    ids: list[int] = []
    for i, r in enumerate(requests):
        if not min_new_tokens_blocks(r):
            continue
        blocked = set(r.stop_token_ids) | (set() if r.ignore_eos else set(eos_token_ids))
        rows += [i] * len(blocked)
        ids += sorted(blocked)
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(ids, dtype=torch.int64, device=device),
    )


def apply_logit_bias(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, values: torch.Tensor
) -> None:
    """Adds ``values[j]`` to ``logits[rows[j], token_ids[j]]`` for each j, in place.

    Args:
        logits: float32 [B, V].
        rows, token_ids: int64 [N] (pairs unique); values: float32 [N].
    """
    logits.index_put_((rows, token_ids), values, accumulate=True)


def apply_min_new_tokens(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
    """Sets ``logits[rows[j], token_ids[j]]`` to -inf for each j, in place.

    Args:
        logits: float32 [B, V].
        rows, token_ids: int64 [N], the (row, id) pairs blocked by ``min_new_tokens``.
    """
    logits.index_put_((rows, token_ids), torch.tensor(float("-inf"), device=logits.device))


def token_counts(
    token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """How many times each id occurs in each row's list.

    Args:
        token_ids: B lists of ids below ``vocab_size`` (any lengths, empty included).

    Returns:
        float32 [B, vocab_size] counts.
    """
    width = max((len(ids) for ids in token_ids), default=0)
    # NOTE: padding goes to an extra column, cut off at the end.
    padded = torch.full((len(token_ids), width), vocab_size, dtype=torch.int64)
    for i, ids in enumerate(token_ids):
        padded[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    padded = padded.to(device)
    counts = torch.zeros(len(token_ids), vocab_size + 1, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, arXiv:1909.05858; transformers'
    ``RepetitionPenaltyLogitsProcessor``): a seen id's negative logit is multiplied by the row's
    penalty, any other divided by it; unseen ids keep theirs.

    Args:
        logits: float32 [B, V]; seen: bool [B, V]; penalty: float32 [B], > 0 (1: off).

    Returns:
        A new float32 [B, V] tensor.
    """
    p = penalty.unsqueeze(1)
    penalized = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalized, logits)


def apply_presence_frequency(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """OpenAI's penalties: ``logit - presence * (count > 0) - frequency * count`` per id.

    Args:
        logits: float32 [B, V]; counts: float32 [B, V] occurrences in the output;
        presence, frequency: float32 [B] (0: off).

    Returns:
        A new float32 [B, V] tensor.
    """
    return logits - presence.unsqueeze(1) * (counts > 0) - frequency.unsqueeze(1) * counts


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Masks ids whose probability is below ``min_p`` times the row's most likely id's with -inf
    (Nguyen et al. 2024, arXiv:2407.01082).

    Args:
        logits: float32 [B, V], after temperature (and top-k/top-p masks: the ratio of two
            probabilities does not change when masked ids are dropped).
        min_p: float32 [B] in [0, 1]; 0: off.

    Returns:
        A new float32 [B, V] tensor; each row's most likely id stays finite.
    """
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))
