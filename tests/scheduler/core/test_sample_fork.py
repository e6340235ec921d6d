"""n > 1: several samples of one prompt, prefilled once. Sample i of a request seeded with s
yields exactly the tokens of a lone request seeded with s + i, shares the prompt's full blocks,
and every block is free at the end. In-process engine on a tiny float32 dummy model."""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict

import pytest
from factories import make_engine, make_engine_request, make_prompt
from scheduler.core.test_engine_prefix_reuse import PRESET, assert_all_free

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import write_dummy_model
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    EngineRequest,
    FinishReason,
    PositionLogprobs,
    RequestOutput,
    SamplingParams,
)
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.scheduler_output import SchedulerOutput

SEED = 2**64 - 2  # sample 2's seed wraps around to 0
SAMPLING = SamplingParams(temperature=1.0, seed=SEED)
NUM_NEW = 12
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=5))


small_engine = functools.partial(
    make_engine, num_blocks=64, block_size=BLOCK_SIZE, max_num_seqs=8, max_num_batched_tokens=8
)
"""An engine over 64 blocks of 4 tokens with an 8-token step budget (keywords override)."""


def sampled(request_id: str, prompt: list[int], n: int = 1, seed: int = SEED) -> EngineRequest:
    sampling = dataclasses.replace(SAMPLING, seed=seed)
    return make_engine_request(request_id, prompt, NUM_NEW, sampling, ignore_eos=True, n=n)


class Recorder:
    """Steps an engine over requests, recording outputs by (request_id, index) and every step's
    plan."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token_ids: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.reasons: dict[tuple[str, int], list[FinishReason]] = defaultdict(list)
        self.logprobs: dict[tuple[str, int], list[PositionLogprobs]] = defaultdict(list)
        self.plans: list[list[tuple[int, int, int]]] = []
        """Per step: (index, first position, tokens fed) of each request the model ran."""
        execute = engine.runner.execute

        def recording_execute(output: SchedulerOutput):  # noqa: ANN202
            self.plans.append(
                [
                    (s.request.index, s.num_computed_tokens, s.num_new_tokens)
                    for s in output.scheduled
                ]
            )
            return execute(output)

        engine.runner.execute = recording_execute  # type: ignore[method-assign]

    def submit(self, request: EngineRequest) -> None:
        def sink(output: RequestOutput | Exception) -> None:
            assert not isinstance(output, Exception), output
            key = (output.request_id, output.index)
            self.token_ids[key].extend(output.new_token_ids)
            self.reasons[key].append(output.finish_reason)
            self.logprobs[key].extend(output.logprobs)

        self.engine.submit(request, sink)

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            self.engine.process_commands()
            if not self.engine.scheduler.has_unfinished_requests:
                return
            self.engine.step()
        raise AssertionError("the requests did not finish")


def alone(model: LocalModel, request: EngineRequest) -> list[int]:
    engine, _ = small_engine(model)
    recorder = Recorder(engine)
    recorder.submit(request)
    recorder.run()
    return recorder.token_ids[(request.request_id, 0)]


def prompt_tokens_fed(plans: list[list[tuple[int, int, int]]], num_prompt: int) -> int:
    return sum(
        max(0, min(first + num, num_prompt) - first) for plan in plans for _, first, num in plan
    )


def test_n_samples_equal_n_separate_requests_and_the_prompt_is_computed_once(
    model: LocalModel,
) -> None:
    prompt = make_prompt(14, seed=1)  # 3 full blocks of 4 and a partial one; prefilled in 2 steps
    separate = [alone(model, sampled(f"s{i}", prompt, seed=(SEED + i) % 2**64)) for i in range(3)]
    assert len({tuple(t) for t in separate}) == 3  # the seeds draw different samples
    engine, allocator = small_engine(model)
    recorder = Recorder(engine)
    recorder.submit(sampled("r", prompt, n=3))
    while not engine.scheduler.requests or not engine.scheduler.requests["r"].samples:
        engine.process_commands()
        engine.step()
    first = engine.scheduler.requests["r"]
    children = first.samples
    assert [c.index for c in children] == [1, 2]
    assert [c.seed for c in children] == [SEED + 1, 0]
    for child in children:
        assert child.block_ids[:3] == first.block_ids[:3]  # the full blocks, by reference
        assert child.block_ids[3] not in first.block_ids  # the partial block, copied
        assert child.num_computed_tokens == len(prompt)
    assert [allocator.ref_cnt[b] for b in first.block_ids[:3]] == [3, 3, 3]
    recorder.run()
    assert [recorder.token_ids[("r", i)] for i in range(3)] == separate
    for i in range(3):
        assert recorder.reasons[("r", i)] == [FinishReason.UNSPECIFIED] * (NUM_NEW - 1) + [
            FinishReason.LENGTH
        ]
    assert prompt_tokens_fed(recorder.plans, len(prompt)) == len(prompt)
    assert_all_free(engine, allocator)


def test_without_prefix_caching_the_samples_copy_the_whole_prompt(model: LocalModel) -> None:
    prompt = make_prompt(8, seed=5)  # two full blocks: the last one is never found by a lookup
    separate = [alone(model, sampled(f"s{i}", prompt, seed=(SEED + i) % 2**64)) for i in range(2)]
    engine, allocator = small_engine(model, enable_prefix_caching=False)
    recorder = Recorder(engine)
    recorder.submit(sampled("r", prompt, n=2))
    recorder.run()
    assert [recorder.token_ids[("r", i)] for i in range(2)] == separate
    assert prompt_tokens_fed(recorder.plans, len(prompt)) == len(prompt)
    assert_all_free(engine, allocator)


def test_samples_without_room_wait_and_preempted_ones_recompute_the_same_tokens(
    model: LocalModel,
) -> None:
    prompt = make_prompt(9, seed=2)
    separate = [alone(model, sampled(f"s{i}", prompt, seed=(SEED + i) % 2**64)) for i in range(6)]
    # 3 running slots: samples 3 to 5 wait at the fork. 10 blocks of 4 tokens cannot hold three
    # samples' 20 tokens of KV at once (2 shared blocks + 3 of each), so some are preempted.
    engine, allocator = small_engine(model, num_blocks=10, max_num_seqs=3)
    recorder = Recorder(engine)
    recorder.submit(sampled("r", prompt, n=6))
    recorder.run()
    assert engine.scheduler.num_preemptions > 0
    assert [recorder.token_ids[("r", i)] for i in range(6)] == separate
    assert_all_free(engine, allocator)


def test_aborting_a_request_aborts_every_sample_and_frees_their_blocks(model: LocalModel) -> None:
    engine, allocator = small_engine(model)
    recorder = Recorder(engine)
    recorder.submit(sampled("r", make_prompt(10, seed=3), n=4))
    for _ in range(5):
        engine.process_commands()
        engine.step()
    assert len(engine.scheduler.running) == 4
    assert engine.num_streams == 1
    engine.abort("r")
    engine.process_commands()
    assert not engine.scheduler.has_unfinished_requests
    assert_all_free(engine, allocator)


def test_the_stream_ends_with_the_last_sample(model: LocalModel) -> None:
    engine, allocator = small_engine(model)
    recorder = Recorder(engine)
    request = sampled("r", make_prompt(6, seed=4), n=2)
    recorder.submit(dataclasses.replace(request, max_new_tokens=1))
    recorder.run()
    assert dict(recorder.token_ids).keys() == {("r", 0), ("r", 1)}
    assert recorder.reasons[("r", 1)] == [FinishReason.LENGTH]
    assert_all_free(engine, allocator)


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_refused(model: LocalModel, n: int) -> None:
    engine, _ = small_engine(model)
    with pytest.raises(InvalidArgument, match="^n: "):
        engine.scheduler.add_request(sampled("r", [5, 6], n=n))


def test_aborting_one_sample_ends_it_alone_with_an_abort_output(model: LocalModel) -> None:
    prompt = make_prompt(10, seed=6)
    separate = [alone(model, sampled(f"s{i}", prompt, seed=(SEED + i) % 2**64)) for i in (0, 2)]
    engine, allocator = small_engine(model)
    recorder = Recorder(engine)
    recorder.submit(sampled("r", prompt, n=3))
    while len(recorder.token_ids[("r", 1)]) < 3:
        engine.process_commands()
        engine.step()
    engine.abort_sample("r", 1)
    engine.abort_sample("r", 7)  # no such sample: nothing changes
    engine.process_commands()
    assert recorder.reasons[("r", 1)][-1] == FinishReason.ABORT
    assert len(engine.scheduler.running) == 2 and engine.num_streams == 1
    recorder.run()
    assert [recorder.token_ids[("r", i)] for i in (0, 2)] == separate
    assert len(recorder.token_ids[("r", 1)]) == 3
    assert engine.scheduler.abort_sample("r", 0) is None  # finished: unknown now
    assert_all_free(engine, allocator)


def test_each_sample_gets_the_logprobs_of_its_own_tokens(model: LocalModel) -> None:
    prompt = make_prompt(7, seed=7)
    engine, _ = small_engine(model)
    separate = []
    for i in range(2):
        recorder = Recorder(small_engine(model)[0])
        request = sampled(f"s{i}", prompt, seed=(SEED + i) % 2**64)
        recorder.submit(dataclasses.replace(request, logprobs=2))
        recorder.run()
        separate.append(recorder.logprobs[(f"s{i}", 0)])
    recorder = Recorder(engine)
    recorder.submit(dataclasses.replace(sampled("r", prompt, n=2), logprobs=2))
    recorder.run()
    for i in range(2):
        assert [p.chosen.token_id for p in recorder.logprobs[("r", i)]] == recorder.token_ids[
            ("r", i)
        ]
        mine = recorder.logprobs[("r", i)]
        # NOTE: a batch of two rounds logits differently from a lone request in the last bits.
        assert [(p.chosen.token_id, p.rank, [t.token_id for t in p.top]) for p in mine] == [
            (p.chosen.token_id, p.rank, [t.token_id for t in p.top]) for p in separate[i]
        ]
        assert [p.chosen.logprob for p in mine] == pytest.approx(
            [p.chosen.logprob for p in separate[i]], abs=1e-4
        )
