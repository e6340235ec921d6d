"""Batched sampling: greedy, temperature, top-k, top-p and min_p, each token's randomness drawn
from (seed, position). The logits arrive already processed by the sampling controls of
:mod:`zerolayer.scheduler.model.logits_processors` (bias, penalties, min_new_tokens).

A sampled token is chosen by inverse transform sampling: one uniform number ``u`` per token, and
the first vocabulary id whose cumulative probability exceeds ``u`` times the total. ``u`` is not
the next output of a generator's running state but a function of the request's seed and the
token's position in the sequence (:func:`position_uniform`), so that:

- a request's draws do not depend on what else is in the batch (each row reads only its own
  logits and its own ``u``);
- a sequence continued elsewhere (recomputed after preemption, or resubmitted to another
  scheduler as prompt plus the tokens generated so far) draws exactly what it would have drawn:
  the same seed and the same positions give the same ``u``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zerolayer.common.generation import SamplingParams
from zerolayer.scheduler.model.logits_processors import apply_min_p


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Masks logits outside each row's top-k and nucleus (top-p) sets with -inf.

    Args:
        logits: float32 [B, V], already divided by temperature.
        top_k: int64 [B]; 0 means no top-k for that row.
        top_p: float32 [B] in (0, 1]; 1 means no top-p (Holtzman et al. 2019, arXiv:1904.09751).

    Returns:
        A new float32 [B, V] tensor; at least the most likely token of each row stays finite.
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ranks = torch.arange(vocab).unsqueeze(0)
    drop = ranks >= k.unsqueeze(1)
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p. NOTE: rows with top_p 1
    # skip this: float32 rounding can make the mass before a tiny-probability token reach 1.0.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The SplitMix64 output function of the 64-bit integer ``x`` (Steele, Lea and Flood 2014,
    "Fast splittable pseudorandom number generators", OOPSLA; the finalizer of java.util's
    SplittableRandom): a bijection of [0, 2^64) whose outputs pass BigCrush as a sequence."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) that the token at ``position`` of a sequence sampled with
    ``seed`` is drawn with: the top 53 bits of ``splitmix64(seed ^ splitmix64(position))``.

    Args:
        seed: the request's seed, an unsigned 64-bit integer.
        position: the token's 0-based index in prompt plus output.
    """
    return (splitmix64((seed & _MASK64) ^ splitmix64(position)) >> 11) / float(1 << 53)


class Sampler:
    """Chooses one token per row of a logits batch."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        positions: Sequence[int],
        allowed: torch.Tensor | None = None,
    ) -> list[int]:
        """Samples the next token of each row.

        Args:
            logits: float32 [B, V] on any device. The argmax runs there; the rows that sample are
                copied to the CPU and drawn from there.
            params: B sampling parameters, one per row.
            seeds: B unsigned 64-bit seeds, the requests' (greedy rows ignore theirs).
            positions: B positions of the token being sampled (the row's prompt plus output
                length so far).
            allowed: bool [B, V], or None: each row's tokens that may be chosen (structured
                output, :mod:`zerolayer.scheduler.model.structured_output`); the others' logits
                become -inf before anything else, so greedy rows take the allowed argmax.

        Returns:
            B token ids. A row's token depends only on its logits, its parameters, its seed and
            its position: not on the other rows, the batch size or the device.
        """
        if allowed is not None:
            logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        token_ids = logits.argmax(dim=-1).cpu()
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if rows:
            index = torch.tensor(rows)
            temperature = torch.tensor([params[i].temperature for i in rows]).unsqueeze(1)
            top_k = torch.tensor([params[i].top_k for i in rows], dtype=torch.int64)
            top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float32)
            selected = logits[index.to(logits.device)].cpu()
            masked = apply_top_k_top_p(selected / temperature, top_k, top_p)
            min_p = torch.tensor([params[i].min_p for i in rows], dtype=torch.float32)
            if bool((min_p > 0).any()):
                masked = apply_min_p(masked, min_p)
            uniforms = torch.tensor(
                [position_uniform(seeds[i], positions[i]) for i in rows], dtype=torch.float64
            )
            token_ids[index] = inverse_transform(masked.softmax(dim=-1), uniforms)
        return token_ids.tolist()


def inverse_transform(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each row, the first id whose cumulative probability exceeds ``u`` times the row's
    total (inverse transform sampling; the total absorbs rounding of the softmax).

    Args:
        probs: float32 [B, V], rows of probabilities (0 for masked ids, which are never chosen).
        uniforms: float64 [B] in [0, 1).

    Returns:
        int64 [B] token ids.
    """
    cdf = probs.double().cumsum(dim=-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(1)
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    return chosen.clamp(max=probs.shape[-1] - 1)
