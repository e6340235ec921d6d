"""Failover bookkeeping: what a resubmission sends, what the client is told, when it stops."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
from factories import make_engine_request

from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import FinishReason, RequestOutput, SamplingParams
from zerolayer.frontend.routing.failover import (
    INCIDENT_WINDOW_S,
    MAX_INCIDENTS,
    InFlight,
    with_seed,
)

SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=None)


in_flight_request = functools.partial(
    make_engine_request,
    prompt_token_ids=(1, 10, 11, 12),
    max_new_tokens=6,
    ignore_eos=True,
    cache_salt="tenant",
)
"""The request these tests resubmit (``fields`` override its own)."""


def output(*token_ids: int, cached: int = 0, num_prompt: int = 4, finished: bool = False):
    reason = FinishReason.LENGTH if finished else FinishReason.UNSPECIFIED
    return RequestOutput("any", token_ids, reason, num_prompt, cached)


def test_a_resubmission_sends_prompt_plus_generated_and_the_rest_of_the_budget() -> None:
    request = in_flight_request(sampling=dataclasses.replace(SAMPLED, seed=7))
    flight = InFlight(request, max_model_len=64)
    assert flight.submission() == request
    flight.received(output(20, cached=0))
    flight.received(output(21, 22))
    flight.lost(carrying=True, at_s=0.0)
    again = flight.submission()
    assert again == dataclasses.replace(
        request,
        request_id=again.request_id,
        prompt_token_ids=(1, 10, 11, 12, 20, 21, 22),
        max_new_tokens=3,
        num_resumed_output_tokens=3,
    )
    flight.lost(carrying=False, at_s=5.0)  # never reached the next one
    flight.submission()
    assert flight.num_losses == 1


def test_a_resubmission_owes_fewer_min_new_tokens_and_no_prompt_logprobs_once_answered() -> None:
    request = in_flight_request(min_new_tokens=4, prompt_logprobs=2)
    flight = InFlight(request, max_model_len=64)
    flight.submission()
    flight.lost(carrying=True, at_s=0.0)
    assert flight.submission().prompt_logprobs == 2  # nothing was delivered yet
    flight.received(output(20))
    flight.received(output(21))
    flight.lost(carrying=True, at_s=0.1)  # the same incident
    again = flight.submission()
    assert (again.min_new_tokens, again.prompt_logprobs) == (2, None)
    # The earlier output ends the new prompt; the scheduler counts it as output (penalties).
    assert (again.prompt_token_ids[-2:], again.num_resumed_output_tokens) == ((20, 21), 2)


def test_resubmission_ids_are_drawn_afresh_and_no_client_id_pattern() -> None:
    # A client may send "x~1" (or any other string) as its own id; a resubmission of "x" must
    # never be refused as a duplicate of it.
    flight = InFlight(in_flight_request(request_id="x"), max_model_len=64)
    assert flight.submission().request_id == "x"
    ids = []
    for _ in range(3):
        flight.lost(carrying=False, at_s=0.0)
        ids.append(flight.submission().request_id)
    assert all(re.fullmatch("x~[0-9a-f]{32}", i) for i in ids), ids
    assert len(set(ids)) == 3
    # The client only ever sees its own id.
    assert flight.received(output(20)).request_id == "x"


def test_outputs_keep_the_original_prompt_length_and_first_cached_count() -> None:
    flight = InFlight(in_flight_request(), max_model_len=64)
    flight.submission()
    first = flight.received(output(20, cached=2))
    assert (first.request_id, first.num_prompt_tokens, first.num_cached_tokens) == ("r1", 4, 2)
    flight.lost(carrying=True, at_s=0.0)
    flight.submission()
    # The second admission found prompt + generated in the cache; the client is told of the first.
    later = flight.received(output(21, 22, cached=4, num_prompt=5, finished=True))
    assert later == RequestOutput("r1", (21, 22), FinishReason.LENGTH, 4, 2)
    assert flight.generated_token_ids == [20, 21, 22]


def test_outstanding_work_is_the_prompt_until_answered_then_the_tokens_still_to_come() -> None:
    flight = InFlight(in_flight_request(max_new_tokens=6), max_model_len=64)
    assert flight.num_outstanding_tokens == 4 + 6
    flight.submission()
    flight.received(output(20, 21))
    assert flight.num_outstanding_tokens == 4
    flight.lost(carrying=True, at_s=0.0)
    flight.submission()
    assert flight.num_outstanding_tokens == 6 + 4  # prompt + generated to prefill again


def test_the_budget_ends_at_the_context_length_and_a_spent_one_finishes_with_length() -> None:
    flight = InFlight(in_flight_request(max_new_tokens=100), max_model_len=8)
    assert flight.num_remaining_tokens == 4
    flight.submission()
    assert flight.finish_if_spent() is None
    flight.received(output(20, 21, 22, 23, cached=1))
    flight.lost(carrying=True, at_s=0.0)
    assert flight.finish_if_spent() == RequestOutput("r1", (), FinishReason.LENGTH, 4, 1)
    with pytest.raises(ValueError):
        flight.submission()


def test_a_request_lost_in_two_separate_incidents_is_not_retried() -> None:
    flight = InFlight(in_flight_request(), max_model_len=64)
    flight.lost(carrying=False, at_s=0.0)
    flight.lost(carrying=True, at_s=10.0)
    assert (flight.num_losses, flight.num_incidents) == (1, 1)
    with pytest.raises(Unavailable) as info:
        flight.lost(carrying=True, at_s=10.0 + INCIDENT_WINDOW_S + 0.001)
    assert (flight.num_losses, flight.num_incidents) == (2, MAX_INCIDENTS) == (2, 2)
    assert str(info.value) == (
        "scheduler: request 'r1' was in flight on 2 schedulers that died in 2 separate "
        "incidents; it is not retried (it may be what killed them)"
    )


def test_a_second_loss_within_the_window_is_the_same_incident_and_a_third_loss_is_not() -> None:
    # Two schedulers killed together: the request was resubmitted to the one dying second.
    flight = InFlight(in_flight_request(), max_model_len=64)
    flight.lost(carrying=True, at_s=10.0)
    flight.lost(carrying=True, at_s=10.0 + INCIDENT_WINDOW_S)
    assert (flight.num_losses, flight.num_incidents) == (2, 1)
    # A poison request quick to kill: the third death ends it, however soon.
    with pytest.raises(Unavailable, match="on 3 schedulers that died in 2 separate incidents"):
        flight.lost(carrying=True, at_s=10.0 + INCIDENT_WINDOW_S)


def test_only_sampled_requests_without_a_seed_get_one_drawn() -> None:
    greedy = in_flight_request()
    seeded = in_flight_request(sampling=dataclasses.replace(SAMPLED, seed=5))
    assert with_seed(greedy, lambda: 42) is greedy
    assert with_seed(seeded, lambda: 42) is seeded
    drawn = with_seed(in_flight_request(sampling=SAMPLED), lambda: 42)
    assert drawn == in_flight_request(sampling=dataclasses.replace(SAMPLED, seed=42))


def test_a_request_with_n_samples_is_split_into_its_unfinished_samples_once_one_began() -> None:
    request = in_flight_request(sampling=dataclasses.replace(SAMPLED, seed=2**64 - 2), n=3)
    flight = InFlight(request, max_model_len=64)
    flight.submission()
    flight.lost(carrying=False, at_s=0.0)  # nothing generated yet: sent again whole
    assert not flight.must_split
    assert dataclasses.replace(flight.submission(), request_id="r1") == request
    flight.received(dataclasses.replace(output(20, cached=4), index=1))
    flight.received(output(21))
    flight.received(dataclasses.replace(output(22, finished=True), index=2))
    assert (flight.generated_token_ids, flight.must_split, flight.finished) == ([21], True, False)
    flight.lost(carrying=True, at_s=5.0)
    samples = flight.split()
    assert [index for index, _ in samples] == [0, 1]
    submissions = [sample.submission() for _, sample in samples]
    assert [(s.n, s.sampling.seed, s.prompt_token_ids, s.max_new_tokens) for s in submissions] == [
        (1, 2**64 - 2, (1, 10, 11, 12, 21), 5),
        (1, 2**64 - 1, (1, 10, 11, 12, 20), 5),
    ]
    assert all(re.fullmatch("r1~[0-9a-f]{32}", s.request_id) for s in submissions)
    assert samples[1][1].received(output(23)).num_cached_tokens == 4
    assert [(s.num_losses, s.num_incidents) for _, s in samples] == [(1, 1)] * 2


def test_a_sample_is_found_where_it_runs_whole_or_split() -> None:
    flight = InFlight(in_flight_request(n=3), max_model_len=64)
    assert flight.sample_submission(1) is None  # not submitted yet
    flight.submitted_to = ("unix:/a.sock", "r1")
    assert flight.sample_submission(1) == ("unix:/a.sock", "r1", 1)
    flight.received(dataclasses.replace(output(20, finished=True), index=2))
    (_, first), (_, second) = flight.split()
    second.submitted_to = ("unix:/b.sock", "r1~x")
    assert flight.sample_submission(1) == ("unix:/b.sock", "r1~x", 0)  # a request of its own
    assert flight.sample_submission(0) is None  # not resubmitted yet
    assert flight.sample_submission(2) is None  # finished
