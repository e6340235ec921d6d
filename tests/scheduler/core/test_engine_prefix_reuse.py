"""Prefix reuse inside the engine: with prefix caching on, greedy outputs are token for token those
with it off, cached prompt tokens are reported exactly, and every block is free at the end.

The engine runs in-process (scheduler, paged KV over a LocalBlockAllocator, Llama forward, greedy
sampler) on a tiny seeded float32 dummy checkpoint, with token budgets small enough that prompts
are prefilled in chunks.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from factories import make_engine, make_engine_request, make_prompt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.config import WARM_UP_PROMPT_TOKENS
from zerolayer.common.generation import EngineRequest, FinishReason, RequestOutput
from zerolayer.kvstore.in_process import LocalBlockAllocator
from zerolayer.scheduler.core.engine import Engine, call_in_fresh_thread

PRESET = DummyPreset(64, 128, 2, 4, 2, 259, max_position_embeddings=512)
MAX_STEPS = 2000
SALTS = ("", "a", "b")


@dataclass(frozen=True)
class Arrival:
    """A request submitted before step ``step``, aborted before step ``abort_step`` if set."""

    step: int
    request: EngineRequest
    abort_step: int | None = None


@dataclass
class RunResult:
    """What each request received, by request id."""

    token_ids: dict[str, list[int]] = field(default_factory=dict)
    finish_reasons: dict[str, list[FinishReason]] = field(default_factory=dict)
    num_cached_tokens: dict[str, int] = field(default_factory=dict)
    num_preemptions: int = 0


def run(engine: Engine, arrivals: list[Arrival]) -> RunResult:
    """Submits and aborts requests at their steps and steps the engine until all are done."""
    result = RunResult()
    errors: list[Exception] = []

    def sink_for(request_id: str):
        def sink(output: RequestOutput | Exception) -> None:
            if isinstance(output, Exception):
                errors.append(output)
                return
            result.token_ids[request_id].extend(output.new_token_ids)
            result.finish_reasons[request_id].append(output.finish_reason)
            result.num_cached_tokens[request_id] = output.num_cached_tokens

        return sink

    last_event = max(max(a.step, a.abort_step or 0) for a in arrivals)
    for step in range(MAX_STEPS):
        for arrival in arrivals:
            request_id = arrival.request.request_id
            if arrival.step == step:
                result.token_ids[request_id] = []
                result.finish_reasons[request_id] = []
                engine.submit(arrival.request, sink_for(request_id))
            if arrival.abort_step == step:
                engine.abort(request_id)
        engine.process_commands()
        if engine.scheduler.has_unfinished_requests:
            engine.step()
        elif step >= last_event:
            break
    assert errors == []
    assert not engine.scheduler.has_unfinished_requests
    result.num_preemptions = engine.scheduler.num_preemptions
    return result


def run_both(
    model: LocalModel,
    arrivals: list[Arrival],
    block_size: int,
    num_blocks: int,
    max_num_batched_tokens: int,
) -> tuple[RunResult, RunResult, LocalBlockAllocator]:
    """Runs the workload with prefix caching on then off; returns (on, off, on's allocator)."""
    results = []
    allocators = []
    for enable_prefix_caching in (True, False):
        engine, allocator = make_engine(
            model,
            num_blocks,
            block_size,
            max_num_seqs=4,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
        )
        results.append(run(engine, arrivals))
        assert_all_free(engine, allocator)
        allocators.append(allocator)
    assert allocators[1].stats.num_hit_tokens == 0
    assert set(results[1].num_cached_tokens.values()) <= {0}
    return results[0], results[1], allocators[0]


def assert_all_free(engine: Engine, allocator: LocalBlockAllocator) -> None:
    assert allocator.num_free_blocks == allocator.num_blocks_total
    assert allocator.ref_cnt == [0] * allocator.num_blocks_total
    assert engine.stats().num_blocks_held == 0
    assert engine.num_streams == 0


def assert_same_outputs(on: RunResult, off: RunResult, arrivals: list[Arrival]) -> None:
    """Every request that was not aborted got all its tokens, the same with caching on and off."""
    for arrival in arrivals:
        request_id = arrival.request.request_id
        if arrival.abort_step is not None:
            continue
        max_new_tokens = arrival.request.max_new_tokens
        assert len(off.token_ids[request_id]) == max_new_tokens
        assert on.token_ids[request_id] == off.token_ids[request_id], request_id
        expected_reasons = [FinishReason.UNSPECIFIED] * (max_new_tokens - 1) + [FinishReason.LENGTH]
        assert on.finish_reasons[request_id] == expected_reasons
        assert off.finish_reasons[request_id] == expected_reasons


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=5))


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, int, int, list[Arrival]]:
    """(block_size, num_blocks, max_num_batched_tokens, arrivals): requests sharing prefixes."""
    block_size = draw(st.sampled_from([4, 16]))
    bases = [
        make_prompt(
            draw(st.integers(1, 3)) * block_size + draw(st.sampled_from([-1, 0, 1])), seed=100 + i
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    arrivals = []
    for i in range(draw(st.integers(2, 8))):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        suffix_len = draw(st.sampled_from([0, 1, block_size - 1, block_size, block_size + 1]))
        prompt = base + make_prompt(suffix_len, seed=200 + i)
        step = draw(st.integers(0, 12))
        abort_after = draw(st.sampled_from([None, None, None, 0, 1, 3, 6]))
        request = make_engine_request(
            str(i),
            prompt,
            max_new_tokens=draw(st.integers(1, 12)),
            cache_salt=draw(st.sampled_from(SALTS)),
            ignore_eos=True,
        )
        arrivals.append(Arrival(step, request, None if abort_after is None else step + abort_after))
    longest = max(len(a.request.prompt_token_ids) + a.request.max_new_tokens for a in arrivals)
    blocks_for_longest = -(-longest // block_size)
    # A tight pool (room for the longest request and a little more) forces preemption.
    num_blocks = draw(st.sampled_from([blocks_for_longest + 2, 4 * blocks_for_longest + 8]))
    max_num_batched_tokens = draw(st.sampled_from([7, 16, 24]))
    return block_size, num_blocks, max_num_batched_tokens, arrivals


def test_random_shared_prefix_workloads_match_caching_off(model: LocalModel) -> None:
    num_cached_tokens_seen: list[int] = []

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(workloads())
    def check(workload: tuple[int, int, int, list[Arrival]]) -> None:
        block_size, num_blocks, max_num_batched_tokens, arrivals = workload
        on, off, allocator = run_both(
            model, arrivals, block_size, num_blocks, max_num_batched_tokens
        )
        assert_same_outputs(on, off, arrivals)
        # A cached prefix is whole blocks, leaves the last prompt token out, and was computed for
        # an earlier request under the same salt (as a prompt, or prompt plus output).
        by_submission = sorted(arrivals, key=lambda a: a.step)
        for i, arrival in enumerate(by_submission):
            request = arrival.request
            num_cached = on.num_cached_tokens.get(request.request_id, 0)
            assert num_cached % block_size == 0
            assert num_cached <= len(request.prompt_token_ids) - 1
            earlier = [
                list(a.request.prompt_token_ids) + on.token_ids[a.request.request_id]
                for a in by_submission[:i]
                if a.request.cache_salt == request.cache_salt
            ]
            prompt = list(request.prompt_token_ids)
            assert num_cached <= max((common_prefix_len(prompt, t) for t in earlier), default=0)
        assert allocator.stats.num_hit_tokens >= sum(on.num_cached_tokens.values())
        num_cached_tokens_seen.append(sum(on.num_cached_tokens.values()))

    check()
    assert sum(num_cached_tokens_seen) > 0


def test_second_identical_prompt_reuses_all_full_blocks(model: LocalModel) -> None:
    prompt = make_prompt(40, seed=1)
    arrivals = [
        Arrival(0, make_engine_request("first", prompt, max_new_tokens=6, ignore_eos=True)),
        Arrival(20, make_engine_request("second", prompt, max_new_tokens=6, ignore_eos=True)),
    ]
    on, off, allocator = run_both(model, arrivals, 16, 16, 16)
    assert on.num_cached_tokens == {"first": 0, "second": 32}
    assert on.token_ids["second"] == on.token_ids["first"] == off.token_ids["first"]
    assert len(on.token_ids["first"]) == 6
    stats = allocator.stats
    assert (stats.num_queries, stats.num_query_tokens, stats.num_hit_tokens) == (2, 80, 32)
    # 40 prompt tokens + 5 fed outputs: two full blocks per request, the second's were hits.
    assert allocator.num_cached_blocks == 2


def test_request_admitted_during_a_chunked_prefill_reuses_its_computed_blocks(
    model: LocalModel,
) -> None:
    prompt = make_prompt(40, seed=1)
    arrivals = [
        Arrival(0, make_engine_request("first", prompt, max_new_tokens=4, ignore_eos=True)),
        Arrival(0, make_engine_request("second", prompt, max_new_tokens=4, ignore_eos=True)),
    ]
    # Budget 16: the first request takes steps 0 and 1 alone (blocks 0 and 1 are committed after
    # each); the second is admitted at step 2 next to the first's last 8 prompt tokens.
    on, off, _ = run_both(model, arrivals, 16, 16, 16)
    assert on.num_cached_tokens == {"first": 0, "second": 32}
    assert on.token_ids == off.token_ids
    assert on.token_ids["first"] == on.token_ids["second"]


def test_follow_up_turn_reuses_the_answer_blocks(model: LocalModel) -> None:
    first_prompt = make_prompt(40, seed=2)
    first = make_engine_request("first", first_prompt, max_new_tokens=16, ignore_eos=True)
    engine, allocator = make_engine(
        model, 32, 16, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=True
    )
    first_result = run(engine, [Arrival(0, first)])
    answer = first_result.token_ids["first"]
    assert len(answer) == 16
    # 40 prompt tokens + 15 fed answer tokens = 55 computed: blocks 0-2 (48 tokens) are cached.
    follow_up_prompt = first_prompt + answer + make_prompt(5, seed=3)
    follow_up = make_engine_request(
        "follow-up", follow_up_prompt, max_new_tokens=8, ignore_eos=True
    )
    on = run(engine, [Arrival(0, follow_up)])
    assert on.num_cached_tokens == {"follow-up": 48}
    assert_all_free(engine, allocator)
    off_engine, off_allocator = make_engine(
        model, 32, 16, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False
    )
    off = run(off_engine, [Arrival(0, follow_up)])
    assert off.num_cached_tokens == {"follow-up": 0}
    assert on.token_ids == off.token_ids
    assert_all_free(off_engine, off_allocator)


def test_a_different_cache_salt_reuses_nothing(model: LocalModel) -> None:
    prompt = make_prompt(40, seed=1)
    arrivals = [
        Arrival(
            0,
            make_engine_request(
                "a", prompt, max_new_tokens=4, cache_salt="tenant-a", ignore_eos=True
            ),
        ),
        Arrival(
            20,
            make_engine_request(
                "b", prompt, max_new_tokens=4, cache_salt="tenant-b", ignore_eos=True
            ),
        ),
        Arrival(40, make_engine_request("no-salt", prompt, max_new_tokens=4, ignore_eos=True)),
        Arrival(
            60,
            make_engine_request(
                "a-again", prompt, max_new_tokens=4, cache_salt="tenant-a", ignore_eos=True
            ),
        ),
    ]
    on, off, allocator = run_both(model, arrivals, 16, 32, 16)
    assert on.num_cached_tokens == {"a": 0, "b": 0, "no-salt": 0, "a-again": 32}
    assert on.token_ids == off.token_ids
    assert len(set(map(tuple, on.token_ids.values()))) == 1
    assert allocator.stats.num_hit_tokens == 32


def test_preemption_with_prefix_caching_matches_caching_off(model: LocalModel) -> None:
    system = make_prompt(23, seed=4)
    arrivals = [
        Arrival(
            i,
            make_engine_request(
                str(i), system + make_prompt(3 + 4 * i, seed=10 + i), 20, ignore_eos=True
            ),
        )
        for i in range(4)
    ]
    # Block size 4, 24 blocks: the four requests need 14 + 15 + 16 + 17 blocks at the end.
    on, off, allocator = run_both(model, arrivals, 4, 24, 8)
    assert on.num_preemptions > 0
    assert off.num_preemptions > 0
    assert_same_outputs(on, off, arrivals)
    assert sum(on.num_cached_tokens.values()) > 0
    assert allocator.stats.num_evictions > 0


def test_a_request_preempted_before_its_first_token_reports_no_cached_tokens(
    model: LocalModel,
) -> None:
    prompt = make_prompt(10, seed=6)
    arrivals = [
        Arrival(0, make_engine_request("0", prompt[:7], max_new_tokens=3, ignore_eos=True)),
        Arrival(
            0, make_engine_request("1", prompt, max_new_tokens=1, cache_salt="a", ignore_eos=True)
        ),
    ]
    # 5 blocks of 4: request 1 is preempted after its first block is committed; on its recompute
    # it hits that block, which it computed itself, so it is not reported as cached, nor counted
    # by the prefix-cache counters (they count each request's first admission: 7 + 10 tokens).
    on, off, allocator = run_both(model, arrivals, 4, 5, 7)
    assert (on.num_preemptions, off.num_preemptions) == (1, 1)
    assert on.num_cached_tokens == {"0": 0, "1": 0}
    stats = allocator.stats
    assert (stats.num_queries, stats.num_query_tokens, stats.num_hit_tokens) == (2, 17, 0)
    assert_same_outputs(on, off, arrivals)


def test_start_runs_the_warm_up_on_the_engine_thread(model: LocalModel) -> None:
    engine, allocator = make_engine(
        model, 64, 4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )
    threads: list[str] = []
    execute = engine.runner.execute

    def spy(output):  # noqa: ANN001, ANN202
        threads.append(threading.current_thread().name)
        return execute(output)

    engine.runner.execute = spy  # type: ignore[method-assign]
    try:
        assert engine.start(warm_up_tokens=9) > 0
        assert threads and set(threads) == {"engine"}
        assert engine.num_steps >= 2  # prefill and at least one decode
    finally:
        engine.stop()
    assert_all_free(engine, allocator)
    assert allocator.num_cached_blocks > 0  # it ran, and is not traffic:
    assert allocator.stats.num_queries == 0


def test_start_raises_what_the_warm_up_raised(model: LocalModel) -> None:
    engine, _ = make_engine(
        model, 64, 4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )

    def broken(output):  # noqa: ANN001, ANN202
        raise RuntimeError("forward exploded")

    engine.runner.execute = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="forward exploded"):
        engine.start(warm_up_tokens=4)
    assert not engine.is_running


def test_call_in_fresh_thread_returns_and_raises_on_the_caller() -> None:
    names = call_in_fresh_thread(lambda: threading.current_thread().name)
    assert names == "engine-build" != threading.current_thread().name

    def fail() -> None:
        raise ValueError("nope")

    with pytest.raises(ValueError, match="nope"):
        call_in_fresh_thread(fail)


def test_the_warm_up_fits_a_context_shorter_than_its_prompt(tmp_path: Path) -> None:
    """A model whose context (or sliding-window cap) is shorter than the 32-token warm-up prompt
    warms up on a shorter one instead of failing start-up (transformers serves such models)."""
    short = dataclasses.replace(PRESET, max_position_embeddings=16)
    model = LocalModel.load(write_dummy_model(tmp_path / "short", short, seed=5))
    engine, allocator = make_engine(
        model, 16, 4, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
    )
    try:
        assert engine.start(warm_up_tokens=WARM_UP_PROMPT_TOKENS) > 0
    finally:
        engine.stop()
    assert_all_free(engine, allocator)
