"""Prefix reuse end to end on the shared stack: cached prompt tokens, cache salts, multi-turn, the
kvstore's counters. A kvstore killed mid-stream: tests/e2e/test_restarts.py."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from e2e.stack import generate_ids, kv_stats, running_stack, text_stub

from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

SYSTEM_PROMPT = [1, *[(7 * i) % 250 + 3 for i in range(400)]]


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.stack


@pytest.fixture(scope="module")
def stub(stack):
    return text_stub(stack)


def generate(stub, ids: list[int], salt: str = "", max_new_tokens: int = 16) -> pb.GenerateResponse:
    return generate_ids(stub, ids, max_new_tokens, salt)


def chat(stub, salt: str) -> list[pb.GenerateResponse]:
    """8 turns; each sends the whole history (token ids) plus a new 10-token user message."""
    history = list(SYSTEM_PROMPT)
    responses = []
    for turn in range(8):
        history += [(turn * 31 + j) % 250 + 3 for j in range(10)]
        response = generate(stub, history, salt)
        responses.append(response)
        history += list(response.token_ids)
    return responses


def test_same_prompt_reuses_blocks_within_a_salt_only(stub) -> None:
    prompt = [1, *range(3, 3 + 70)]  # 71 tokens: 4 full blocks within the first 70
    first = generate(stub, prompt, salt="tenant-a")
    again = generate(stub, prompt, salt="tenant-a")
    other = generate(stub, prompt, salt="tenant-b")
    assert first.usage.cached_prompt_tokens == 0
    assert again.usage.cached_prompt_tokens == 64
    assert other.usage.cached_prompt_tokens == 0
    assert list(first.token_ids) == list(again.token_ids) == list(other.token_ids)


def test_multi_turn_reports_90_percent_cached_from_turn_two(stub) -> None:
    responses = chat(stub, salt="chat")
    assert responses[0].usage.cached_prompt_tokens == 0
    for response in responses[1:]:
        assert response.usage.cached_prompt_tokens >= 0.9 * response.usage.prompt_tokens


def test_multi_turn_outputs_equal_without_prefix_caching(stack, stub, tmp_path: Path) -> None:
    model_dir = Path(stack.config.model_dir)
    with running_stack(model_dir, tmp_path, enable_prefix_caching=False) as plain:
        plain_stub = text_stub(plain)
        uncached = chat(plain_stub, salt="chat-compare")
        assert all(r.usage.cached_prompt_tokens == 0 for r in uncached)
        assert not kv_stats(plain).prefix_caching_enabled
    cached = chat(stub, salt="chat-compare")
    assert [list(r.token_ids) for r in cached] == [list(r.token_ids) for r in uncached]


def test_stats_and_metrics_count_queries_and_hits(stack, stub) -> None:
    before = kv_stats(stack)
    prompt = [1, *range(100, 140)]
    generate(stub, prompt, salt="metrics")
    generate(stub, prompt, salt="metrics")
    after = kv_stats(stack)
    assert after.num_prefix_queries - before.num_prefix_queries == 2
    assert after.num_prefix_hit_tokens - before.num_prefix_hit_tokens == 32
    assert after.num_blocks_cached > 0 and after.prefix_caching_enabled
    port = stack.config.metrics_port("kvstore")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["zerolayer_kv_prefix_queries_total"] == after.num_prefix_queries
    assert values["zerolayer_kv_prefix_hit_tokens_total"] == after.num_prefix_hit_tokens
    states = [values[f'zerolayer_kv_blocks{{state="{s}"}}'] for s in ("used", "cached", "free")]
    evictable = after.num_blocks_evictable
    assert states == [after.num_blocks_used, evictable, after.num_blocks_free - evictable]
    assert 0 < evictable <= after.num_blocks_cached
    assert sum(states) == values["zerolayer_kv_blocks_capacity"] == after.num_blocks_total
    assert "zerolayer_kv_prefix_hit_ratio" not in values
