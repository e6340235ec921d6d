"""The scheduler's metrics, read from a real engine (tiny dummy model, in-process block pool):
every sequence that ends is counted once whatever ended it, the warm-up is not traffic, a scrape
changes nothing another reads, and the gauges routers and autoscalers read say what they claim."""

from __future__ import annotations

import pytest
from factories import make_engine
from prometheus_client import CollectorRegistry

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.generation import (
    EngineRequest,
    FinishReason,
    RequestOutput,
    SamplingParams,
)
from zerolayer.common.metrics import LATENCY_BUCKETS_S
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.metrics import register_model_info, register_serving

PRESET = DummyPreset(64, 128, 2, 4, 2, 259, max_position_embeddings=100)
BLOCK_SIZE = 4
NUM_BLOCKS = 16
P = "zerolayer_scheduler_"
REASONS = ("LENGTH", "EOS", "STOP", "ABORT")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=1))


def metered_engine(model: LocalModel) -> tuple[Engine, CollectorRegistry]:
    """An engine (4 sequences, 32-token steps, 16 blocks of 4) whose metrics go to a registry
    of its own."""
    registry = CollectorRegistry()
    engine, _ = make_engine(
        model, NUM_BLOCKS, BLOCK_SIZE, registry=registry, max_num_seqs=4, max_num_batched_tokens=32
    )
    return engine, registry


def submit(engine: Engine, request_id: str, prompt: tuple[int, ...], max_new_tokens: int, **kw):
    outputs: list[RequestOutput] = []
    request = EngineRequest(request_id, prompt, max_new_tokens, SamplingParams(), **kw)
    engine.submit(request, outputs.append)
    engine.process_commands()
    return outputs


def run_until_idle(engine: Engine) -> None:
    while engine.scheduler.has_unfinished_requests:
        engine.process_commands()
        engine.step()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(P + name, labels)
    assert found is not None, name
    return found


def finished(registry: CollectorRegistry) -> dict[str, float]:
    return {r: value(registry, "finished_requests_total", finish_reason=r) for r in REASONS}


def test_every_sequence_that_ends_is_timed_and_counted_whatever_ended_it(
    model: LocalModel,
) -> None:
    engine, registry = metered_engine(model)
    prompt = tuple(range(10, 16))
    greedy = submit(engine, "greedy", prompt, 3, ignore_eos=True)
    run_until_idle(engine)
    tokens = [output.new_token_ids[0] for output in greedy]
    stop_id = submit(engine, "stop-id", prompt, 3, ignore_eos=True, stop_token_ids=(tokens[1],))
    run_until_idle(engine)
    assert stop_id[-1].finish_reason == FinishReason.STOP
    submit(engine, "stop-string", prompt, 50, ignore_eos=True)
    engine.step()  # its first token
    # The frontend matches stop strings itself and then cancels the call: an abort here.
    engine.abort("stop-string")
    submit(engine, "cancelled-waiting", prompt, 3)
    engine.abort("cancelled-waiting")  # before any token
    run_until_idle(engine)
    assert finished(registry) == {"LENGTH": 1, "EOS": 0, "STOP": 1, "ABORT": 2}
    assert value(registry, "e2e_seconds_count") == 4
    assert value(registry, "ttft_seconds_count") == 3  # the one cancelled while waiting: none
    lengths = [3, len(stop_id), 1, 0]
    assert value(registry, "generation_length_tokens_count") == 4
    assert value(registry, "generation_length_tokens_sum") == sum(lengths)
    assert value(registry, "generated_tokens_total") == sum(lengths)
    assert value(registry, "prompt_length_tokens_count") == 3
    assert value(registry, "prompt_tokens_total") == value(registry, "prompt_length_tokens_sum")
    assert value(registry, "prompt_tokens_total") == 3 * len(prompt)
    assert value(registry, "e2e_seconds_bucket", le="1800.0") == 4
    assert LATENCY_BUCKETS_S[-1] >= 1800.0


def test_the_warm_up_is_not_traffic(model: LocalModel) -> None:
    engine, registry = metered_engine(model)
    engine.warm_up(9)
    assert engine.scheduler.kv.allocator.num_cached_blocks > 0  # it did run
    for name in (
        "generated_tokens_total",
        "prompt_tokens_total",
        "cached_prompt_tokens_total",
        "preemptions_total",
        "ttft_seconds_count",
        "itl_seconds_count",
        "e2e_seconds_count",
        "queue_seconds_count",
        "step_gap_seconds_count",
        "prompt_length_tokens_count",
        "generation_length_tokens_count",
    ):
        assert value(registry, name) == 0, name
    assert finished(registry) == dict.fromkeys(REASONS, 0)
    submit(engine, "first", tuple(range(10, 16)), 2)
    run_until_idle(engine)
    assert value(registry, "generated_tokens_total") == 2
    assert value(registry, "e2e_seconds_count") == 1
    # One gap between the two steps of the request, in seconds (not microseconds: any gap above
    # 1 us would read 1 or more). Under 1 s, not tighter: the other worker's tests run beside.
    assert value(registry, "step_gap_seconds_count") == 1
    assert 0 < value(registry, "step_gap_seconds_sum") < 1.0


def test_a_scrape_changes_nothing_another_reads(model: LocalModel) -> None:
    engine, registry = metered_engine(model)
    submit(engine, "r", tuple(range(10, 16)), 4)
    run_until_idle(engine)
    names = {metric.name for metric in registry.collect()}
    assert P + "page_faults_per_token" not in names
    first = {
        (s.name, tuple(s.labels.items())): s.value for m in registry.collect() for s in m.samples
    }
    registry.collect()
    again = {
        (s.name, tuple(s.labels.items())): s.value for m in registry.collect() for s in m.samples
    }
    faults = [key for key in first if key[0] == P + "page_faults_total"]
    assert len(faults) == 2
    assert all(again[key] >= first[key] for key in faults)
    steady = {key: v for key, v in first.items() if key not in faults and "created" not in key[0]}
    assert {key: again[key] for key in steady} == steady


def test_the_router_gauges_count_shared_blocks_once_and_show_the_limits(
    model: LocalModel,
) -> None:
    engine, registry = metered_engine(model)
    prompt = tuple(range(10, 23))  # 13 tokens: 3 full blocks, the 4th holds the last token
    submit(engine, "warm", prompt, 1)
    run_until_idle(engine)  # its 3 full blocks stay cached, held by nobody
    assert value(registry, "kv_cache_utilization") == 0
    submit(engine, "a", prompt, 8)
    submit(engine, "b", prompt, 8)
    engine.step()  # both prefill their last token (own block) on the 3 cached blocks
    held = engine.scheduler.kv.num_blocks_held
    assert held == 8  # 3 shared + 1 own, twice
    assert value(registry, "kv_blocks_held") == 8
    assert value(registry, "kv_cache_utilization") == 5 / NUM_BLOCKS
    assert value(registry, "requests_running") == 2
    assert value(registry, "requests_waiting") == 0
    assert value(registry, "max_num_seqs") == 4
    assert value(registry, "max_num_batched_tokens") == 32
    engine.abort("a")
    engine.process_commands()
    assert value(registry, "kv_cache_utilization") == 4 / NUM_BLOCKS
    run_until_idle(engine)
    assert value(registry, "kv_cache_utilization") == 0


def test_the_model_and_the_serving_state_are_exported() -> None:
    registry = CollectorRegistry()
    serving = [False]
    register_model_info(registry, "tiny", "ab12")
    register_serving(registry, lambda: serving[0])
    labels = {"model": "tiny", "fingerprint": "ab12"}
    assert registry.get_sample_value(P + "model_info", labels) == 1
    assert registry.get_sample_value(P + "serving") == 0
    serving[0] = True
    assert registry.get_sample_value(P + "serving") == 1
