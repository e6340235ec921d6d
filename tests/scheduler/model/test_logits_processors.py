"""Tests for the sampling controls' logits processors: exact processed logits on hand-built rows."""

from __future__ import annotations

import math

import torch
from factories import make_request

from zerolayer.common.generation import SamplingParams
from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.model.logits_processors import (
    apply_logits_processors,
    apply_min_p,
    token_counts,
)
from zerolayer.scheduler.model.sampler import Sampler

NEG_INF = float("-inf")
EOS_TOKEN_IDS = (2,)


def process(rows: list[list[float]], requests: list[Request]) -> torch.Tensor:
    return apply_logits_processors(torch.tensor(rows), requests, EOS_TOKEN_IDS)


def test_a_batch_without_controls_is_returned_as_is() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    requests = [
        make_request(
            "r",
            (0,),
            output_token_ids=(5,),
            min_new_tokens=1,
            sampling=SamplingParams(temperature=0.7, min_p=0.3),
        )
    ]
    assert apply_logits_processors(logits, requests, EOS_TOKEN_IDS) is logits


def test_logit_bias_adds_to_its_ids_and_leaves_other_rows_alone() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    requests = [
        make_request("r", (0,), sampling=SamplingParams(logit_bias=((0, 0.5), (3, -100.0)))),
        make_request("r", (0,)),
    ]
    out = apply_logits_processors(logits, requests, EOS_TOKEN_IDS)
    assert out.tolist() == [[1.5, 2.0, 3.0, -96.0], [1.0, 1.0, 1.0, 1.0]]
    assert logits.tolist() == [[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]]


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    out = process(
        [[1.0, 2.0, 3.0, 4.0]] * 4,
        [
            make_request("r", (0,), output_token_ids=(3,), min_new_tokens=2, stop_token_ids=(1,)),
            make_request("r", (0,), output_token_ids=(3,), min_new_tokens=1, stop_token_ids=(1,)),
            make_request("r", (0,), min_new_tokens=1, stop_token_ids=(0,), ignore_eos=True),
            make_request("r", (0,)),
        ],
    )
    assert out.tolist() == [
        [1.0, NEG_INF, NEG_INF, 4.0],
        [1.0, 2.0, 3.0, 4.0],
        [NEG_INF, 2.0, 3.0, 4.0],
        [1.0, 2.0, 3.0, 4.0],
    ]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_ids() -> None:
    out = process(
        [[2.0, -2.0, 4.0, -4.0, 0.0]],
        [
            make_request(
                "r",
                (0,),
                output_token_ids=(1, 4, 1),
                sampling=SamplingParams(repetition_penalty=2.0),
            )
        ],
    )
    assert out.tolist() == [[1.0, -4.0, 4.0, -4.0, 0.0]]


def test_presence_and_frequency_penalties_count_output_tokens_only() -> None:
    out = process(
        [[0.0, 0.0, 0.0, 0.0]],
        [
            make_request(
                "r",
                (0, 0),
                output_token_ids=(1, 1, 3),
                sampling=SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
            )
        ],
    )
    assert out.tolist() == [[0.0, -1.0, 0.0, -0.75]]


def test_a_resubmitted_requests_earlier_output_counts_for_presence_and_frequency() -> None:
    # After a failover the earlier output (1, 1) ends the prompt: it is penalised as output,
    # the rest of the prompt (0, 2) is not, exactly as on the scheduler that died.
    resumed = make_request(
        "r",
        (0, 2, 1, 1),
        output_token_ids=(3,),
        num_resumed_output_tokens=2,
        sampling=SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
    )
    out = process([[1.0, 1.0, 1.0, 1.0]], [resumed])
    assert out.tolist() == [[1.0, 0.0, 1.0, 0.25]]


def test_negative_presence_penalty_raises_the_logits_of_output_tokens() -> None:
    out = process(
        [[0.0, 0.0, 0.0]],
        [
            make_request(
                "r", (0,), output_token_ids=(2, 2), sampling=SamplingParams(presence_penalty=-1.5)
            )
        ],
    )
    assert out.tolist() == [[0.0, 0.0, 1.5]]


def test_processors_apply_in_order_bias_min_new_tokens_repetition_presence_frequency() -> None:
    # id 1: -1 + bias 2 = 1, then repetition 2 -> 0.5, then presence 0.25 -> 0.25 (repetition
    # before the bias would give -2 + 2 = 0). id 2 (EOS) is -inf whatever the bias.
    out = process(
        [[1.0, -1.0, 5.0, 0.5]],
        [
            make_request(
                "r",
                (0,),
                output_token_ids=(1,),
                min_new_tokens=2,
                sampling=SamplingParams(
                    logit_bias=((1, 2.0), (2, 50.0)), repetition_penalty=2.0, presence_penalty=0.25
                ),
            )
        ],
    )
    assert out.tolist() == [[0.5, 0.25, NEG_INF, 0.5]]


def test_greedy_rows_take_the_argmax_of_the_processed_logits() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0]])
    requests = [
        make_request(
            "r", (0,), output_token_ids=(1,), sampling=SamplingParams(frequency_penalty=2.0)
        ),
        make_request("r", (0,)),
    ]
    processed = apply_logits_processors(logits, requests, EOS_TOKEN_IDS)
    assert Sampler()(processed, [r.sampling for r in requests], [0, 0], [2, 2]) == [2, 1]


def test_token_counts_counts_each_id_per_row() -> None:
    counts = token_counts([[1, 1, 3], [], [0]], 4, torch.device("cpu"))
    assert counts.tolist() == [[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_min_p_masks_ids_below_min_p_times_the_top_probability() -> None:
    logits = torch.tensor([[math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]] * 2)
    out = apply_min_p(logits, torch.tensor([0.4, 0.0]))
    assert out[0].tolist() == [logits[0, 0].item(), logits[0, 1].item(), NEG_INF, NEG_INF]
    assert torch.equal(out[1], logits[1])


def test_min_p_in_the_sampler_never_draws_a_masked_id() -> None:
    # Only ids 0 and 1 survive min_p 0.4; every seed draws one of them.
    logits = torch.tensor([[math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]])
    params = [SamplingParams(temperature=1.0, min_p=0.4)]
    drawn = {Sampler()(logits, params, [seed], [0])[0] for seed in range(200)}
    assert drawn == {0, 1}
