"""Tests for the sampler: greedy, top-k/top-p masks, draws from (seed, position), distributions."""

from __future__ import annotations

import math

import pytest
import torch

from zerolayer.common.generation import SamplingParams
from zerolayer.scheduler.model.sampler import (
    Sampler,
    apply_top_k_top_p,
    inverse_transform,
    position_uniform,
    splitmix64,
)

NEG_INF = float("-inf")

# Probabilities 0.2, 0.4, 0.1, 0.3 (descending order: index 1, 3, 0, 2).
PROBS_ROW = [0.2, 0.4, 0.1, 0.3]


def make_logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds, positions=None) -> list[int]:
    """Sampler() on ``logits`` with one seed per row, every row at position 0 unless given."""
    return Sampler()(logits, params, list(seeds), list(positions or [0] * len(params)))


def mask(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """apply_top_k_top_p on a single row."""
    return apply_top_k_top_p(
        logits.unsqueeze(0),
        torch.tensor([top_k], dtype=torch.int64),
        torch.tensor([top_p], dtype=torch.float32),
    )[0]


def test_greedy_is_argmax() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    token_ids = sample(logits, [SamplingParams()] * 4, [0, 1, 2, 3])
    assert token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.1, 1.0, 10.0, 1000.0])
def test_top_k_one_equals_greedy_at_any_temperature(temperature: float) -> None:
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=temperature, top_k=1)] * 8
    token_ids = sample(logits, params, range(8))
    assert token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [1e-7, 0.0, 9e-6])
def test_tiny_temperature_is_greedy(temperature: float) -> None:
    logits = make_logits([[0.0, 0.1, 0.2, 0.15], [3.0, 2.9, -1.0, 0.0]])
    token_ids = sample(logits, [SamplingParams(temperature=temperature)] * 2, [5, 6])
    assert token_ids == [2, 0]


def test_top_k_two_keeps_the_two_largest_logits() -> None:
    logits = torch.tensor(PROBS_ROW).log()
    masked = mask(logits, top_k=2, top_p=1.0)
    assert masked.tolist() == [NEG_INF, logits[1].item(), NEG_INF, logits[3].item()]


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.3, [1]),  # 0.4 alone reaches 0.3
        (0.5, [1, 3]),  # 0.4 < 0.5, then 0.4 + 0.3 reaches it
        (0.75, [1, 3, 0]),  # 0.7 < 0.75, 0.9 reaches it
        (0.95, [1, 3, 0, 2]),
    ],
)
def test_top_p_keeps_exactly_the_tokens_needed_to_reach_p(top_p: float, kept: list[int]) -> None:
    logits = torch.tensor(PROBS_ROW).log()
    masked = mask(logits, top_k=0, top_p=top_p)
    expected = [logits[i].item() if i in kept else NEG_INF for i in range(4)]
    assert masked.tolist() == expected


def test_top_p_applies_to_probabilities_renormalized_after_top_k() -> None:
    # After top_k=2: 0.4 / 0.7 = 0.571 alone reaches top_p 0.5.
    logits = torch.tensor(PROBS_ROW).log()
    masked = mask(logits, top_k=2, top_p=0.5)
    assert masked.tolist() == [NEG_INF, logits[1].item(), NEG_INF, NEG_INF]


def test_top_p_one_and_top_k_zero_keep_every_token() -> None:
    # The last token's probability (~1e-18) vanishes next to the others' float32 sum.
    logits = make_logits([[2.0, 1.0, 0.0, -40.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]])
    masked = apply_top_k_top_p(
        logits, torch.tensor([0, 0], dtype=torch.int64), torch.tensor([1.0, 1.0])
    )
    assert torch.equal(masked, logits)


def test_rows_get_their_own_top_k_and_top_p() -> None:
    logits = torch.tensor([PROBS_ROW, PROBS_ROW[::-1]]).log()
    masked = apply_top_k_top_p(
        logits, torch.tensor([1, 0], dtype=torch.int64), torch.tensor([1.0, 0.5])
    )
    # Row 1 holds 0.3, 0.1, 0.4, 0.2: top_p 0.5 keeps index 2 (0.4) and index 0 (0.3).
    assert masked.isfinite().tolist() == [[False, True, False, False], [True, False, True, False]]


def draw_many(seed: int, num_draws: int, vocab_size: int) -> list[int]:
    """The tokens at positions 0 .. num_draws-1 of one seeded sequence over a flat distribution,
    one single-row draw each."""
    logits = torch.zeros(1, vocab_size)
    params = [SamplingParams(temperature=1.0)]
    return [sample(logits, params, [seed], [position])[0] for position in range(num_draws)]


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    first = draw_many(seed=1234, num_draws=1000, vocab_size=64)
    again = draw_many(seed=1234, num_draws=1000, vocab_size=64)
    other = draw_many(seed=4321, num_draws=1000, vocab_size=64)
    assert first == again
    assert first != other
    assert sum(a == b for a, b in zip(first, other, strict=True)) < 100  # ~1000/64 by chance


def test_a_rows_draw_does_not_depend_on_other_rows() -> None:
    sampler = Sampler()
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=None),
        SamplingParams(temperature=1.3, top_k=20),
        SamplingParams(),  # greedy neighbour
    ]
    for seed in range(20):
        batched = sampler(logits, params, [seed + 100, seed, seed + 200], [7, 3, 9])
        alone = sampler(logits[1:2], params[1:2], [seed], [3])
        assert batched[1] == alone[0]
        assert batched[2] == logits[2].argmax().item()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def sample_counts(logits: torch.Tensor, params: SamplingParams, num_draws: int) -> torch.Tensor:
    """Histogram of num_draws rows of ``logits`` [V], each row with its own seed."""
    batch = logits.expand(num_draws, -1).contiguous()
    token_ids = sample(batch, [params] * num_draws, range(num_draws))
    return torch.bincount(torch.tensor(token_ids), minlength=logits.numel()).float()


def test_sampled_frequencies_follow_softmax_of_logits_over_temperature() -> None:
    logits = torch.tensor([0.5, 1.0, -0.3, 2.0, 0.0])
    temperature = 0.7
    counts = sample_counts(logits, SamplingParams(temperature=temperature), 20_000)
    probs = (logits / temperature).softmax(-1)
    # 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    assert chi_square(counts, probs) < 18.47


def test_sampled_frequencies_with_top_k_follow_the_renormalized_top_k() -> None:
    logits = torch.tensor([0.5, 1.0, -0.3, 2.0, 0.0])
    counts = sample_counts(logits, SamplingParams(temperature=1.5, top_k=3), 20_000)
    assert counts[2].item() == 0 and counts[4].item() == 0
    kept = torch.tensor([0, 1, 3])
    probs = (logits[kept] / 1.5).softmax(-1)
    # 2 degrees of freedom: P(chi2 > 13.82) = 0.001.
    assert chi_square(counts[kept], probs) < 13.82
    assert math.isclose(float(counts.sum()), 20_000)


def test_splitmix64_is_the_published_generator() -> None:
    # The first outputs of SplitMix64 from state 0 (Steele, Lea and Flood 2014; the reference
    # generator behind xoshiro's seeding): state advances by the golden gamma each call.
    gamma = 0x9E3779B97F4A7C15
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(gamma) == 0x6E789E6AA1B965F4
    assert splitmix64(2 * gamma) == 0x06C45D188009454F


def test_a_positions_uniform_is_a_pure_function_of_seed_and_position() -> None:
    assert position_uniform(42, 7) == position_uniform(42, 7)
    values = {position_uniform(seed, position) for seed in range(50) for position in range(50)}
    assert len(values) == 2500
    assert all(0.0 <= u < 1.0 for u in values)
    assert position_uniform(2**64 - 1, 0) == position_uniform(-1, 0)  # seeds are taken mod 2^64


@pytest.mark.parametrize(
    ("u", "token_id"), [(0.0, 0), (0.1, 0), (0.3, 1), (0.59, 1), (0.65, 2), (0.71, 3), (0.999, 3)]
)
def test_inverse_transform_picks_the_first_id_whose_cumulative_probability_exceeds_u(
    u: float, token_id: int
) -> None:
    probs = torch.tensor([PROBS_ROW])  # cumulative 0.2, 0.6, 0.7, 1.0
    assert inverse_transform(probs, torch.tensor([u], dtype=torch.float64)).tolist() == [token_id]


def test_inverse_transform_never_picks_a_masked_token() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    uniforms = torch.tensor([0.0, 0.49, 0.5, 0.999999], dtype=torch.float64)
    assert inverse_transform(probs, uniforms).tolist() == [1, 1, 3, 3]


def test_a_draw_depends_on_the_position_not_on_earlier_draws() -> None:
    """A sequence continued from position 5 (a preempted or resubmitted request) draws what the
    uninterrupted sequence drew there."""
    whole = draw_many(seed=9, num_draws=12, vocab_size=64)
    logits = torch.zeros(1, 64)
    params = [SamplingParams(temperature=1.0)]
    continued = [sample(logits, params, [9], [position])[0] for position in range(5, 12)]
    assert continued == whole[5:]
