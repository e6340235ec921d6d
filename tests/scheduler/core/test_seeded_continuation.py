"""Seeded sampling continues exactly: a request's tokens are drawn from (seed, position), so the
tokens of a seeded request do not change when it runs in a batch, is preempted and recomputed, or
is resubmitted as its prompt plus the tokens it already generated (what the frontend does when
the scheduler carrying it dies). In-process engine on a tiny float32 dummy model."""

from __future__ import annotations

import pytest
from factories import make_engine, make_engine_request, make_prompt
from scheduler.core.test_engine_prefix_reuse import PRESET, Arrival, run

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import write_dummy_model
from zerolayer.common.generation import EngineRequest, SamplingParams

SAMPLING = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234)
NUM_NEW = 24


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=5))


def seeded(request_id: str, prompt: list[int], max_new_tokens: int = NUM_NEW) -> EngineRequest:
    return make_engine_request(request_id, prompt, max_new_tokens, SAMPLING, ignore_eos=True)


def tokens_alone(model: LocalModel, request: EngineRequest) -> list[int]:
    engine, _ = make_engine(
        model, 64, 4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )
    return run(engine, [Arrival(0, request)]).token_ids[request.request_id]


@pytest.mark.parametrize("num_done", [1, 7, 16])
def test_a_resubmitted_request_draws_the_rest_of_the_same_tokens(
    model: LocalModel, num_done: int
) -> None:
    prompt = make_prompt(13, seed=1)
    whole = tokens_alone(model, seeded("whole", prompt))
    assert len(set(whole)) > 3  # it samples, it does not repeat one token
    rest = tokens_alone(model, seeded("rest", prompt + whole[:num_done], NUM_NEW - num_done))
    assert rest == whole[num_done:]


def test_a_seeded_request_in_a_batch_draws_what_it_draws_alone(model: LocalModel) -> None:
    prompt = make_prompt(13, seed=1)
    alone = tokens_alone(model, seeded("r", prompt))
    others = [
        Arrival(step, seeded(f"other-{step}", make_prompt(5 + step, seed=step), 10))
        for step in range(3)
    ]
    engine, _ = make_engine(
        model, 64, 4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )
    batched = run(engine, [*others, Arrival(1, seeded("r", prompt))])
    assert batched.token_ids["r"] == alone


def test_a_preempted_seeded_request_draws_what_it_draws_undisturbed(model: LocalModel) -> None:
    arrivals = [Arrival(i, seeded(str(i), make_prompt(9 + 4 * i, seed=10 + i))) for i in range(4)]
    undisturbed = {a.request.request_id: tokens_alone(model, a.request) for a in arrivals}
    # Block size 4, 24 blocks: the four requests together need more, so some are preempted.
    engine, _ = make_engine(
        model, 24, 4, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=True
    )
    squeezed = run(engine, arrivals)
    assert squeezed.num_preemptions > 0
    assert squeezed.token_ids == undisturbed
