"""Batched sampling: greedy, temperature, top-k and top-p, with a generator per request."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zerolayer.common.generation import SamplingParams


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


class Sampler:
    """Chooses one token per row of a logits batch."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
    ) -> list[int]:
        """Samples the next token of each row.

        Args:
            logits: float32 [B, V] on any device. The argmax runs there; the rows that sample are
                copied to the CPU and drawn from there.
            params: B sampling parameters, one per row.
            generators: B CPU generators; a row's draw uses only its own generator, so a request's
                output depends on its seed, not on what else is in the batch (nor on the device).

        Returns:
            B token ids.
        """
        token_ids = logits.argmax(dim=-1).cpu()
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if rows:
            index = torch.tensor(rows)
            temperature = torch.tensor([params[i].temperature for i in rows]).unsqueeze(1)
            top_k = torch.tensor([params[i].top_k for i in rows], dtype=torch.int64)
            top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float32)
            selected = logits[index.to(logits.device)].cpu()
            masked = apply_top_k_top_p(selected / temperature, top_k, top_p)
            probs = masked.softmax(dim=-1)
            for j, i in enumerate(rows):
                token_ids[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
        return token_ids.tolist()
