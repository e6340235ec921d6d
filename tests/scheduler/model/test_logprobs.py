"""Tests for logprobs: exact values on hand-built logits, and prompt logprobs inside the engine
(chunked prefill, preemption, the prefix cache) on a tiny seeded float32 dummy checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from factories import make_engine, make_engine_request

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.common.generation import (
    EngineRequest,
    PositionLogprobs,
    RequestOutput,
    TokenLogprob,
)
from zerolayer.scheduler.model.logprobs import position_logprobs

PRESET = DummyPreset(64, 128, 2, 4, 2, 259, max_position_embeddings=512)


def test_position_logprobs_gives_logprob_rank_and_top_n_of_the_raw_log_softmax() -> None:
    probs = [[0.1, 0.6, 0.3], [0.25, 0.25, 0.5]]
    logits = torch.tensor(probs).log() + torch.tensor([[3.0], [-1.0]])  # softmax ignores shifts
    entries = position_logprobs(logits, [2, 0], [2, 0])
    lp = [[math.log(p) for p in row] for row in probs]
    assert [e.chosen.token_id for e in entries] == [2, 0]
    assert [e.chosen.logprob for e in entries] == pytest.approx([lp[0][2], lp[1][0]], abs=1e-6)
    assert [e.rank for e in entries] == [2, 2]  # a tie counts no id above it
    assert [t.token_id for t in entries[0].top] == [1, 2]
    assert [t.logprob for t in entries[0].top] == pytest.approx([lp[0][1], lp[0][2]], abs=1e-6)
    assert entries[1].top == ()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    return LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=5))


def run(
    model: LocalModel,
    requests: list[EngineRequest],
    num_blocks: int,
    max_num_batched_tokens: int,
) -> tuple[dict[str, list[RequestOutput]], int]:
    """Runs the requests to the end; returns each one's outputs and the preemption count."""
    engine, _ = make_engine(
        model, num_blocks, 4, max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens
    )
    outputs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
    for request in requests:
        engine.submit(request, outputs[request.request_id].append)
    for _ in range(1000):
        engine.process_commands()
        if not engine.scheduler.has_unfinished_requests:
            break
        engine.step()
    return outputs, engine.scheduler.num_preemptions


def logprobs_request(request_id: str, num_prompt_tokens: int, prompt_seed: int) -> EngineRequest:
    """12 greedy tokens with 3 alternatives each, after a random prompt with 2 per position."""
    g = torch.Generator().manual_seed(prompt_seed)
    prompt = torch.randint(3, PRESET.vocab_size, (num_prompt_tokens,), generator=g).tolist()
    return make_engine_request(
        request_id, prompt, 12, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )


def assert_close(got: list[PositionLogprobs], want: list[PositionLogprobs]) -> None:
    assert [(e.chosen.token_id, e.rank) for e in got] == [(e.chosen.token_id, e.rank) for e in want]
    assert [[t.token_id for t in e.top] for e in got] == [[t.token_id for t in e.top] for e in want]
    flat = [v for e in got for v in (e.chosen.logprob, *(t.logprob for t in e.top))]
    expected = [v for e in want for v in (e.chosen.logprob, *(t.logprob for t in e.top))]
    assert flat == pytest.approx(expected, abs=1e-4)


def test_prompt_logprobs_survive_chunked_prefill_preemption_and_a_cached_prefix(
    model: LocalModel,
) -> None:
    requests = [logprobs_request("a", 22, 1), logprobs_request("b", 40, 2)]
    alone, _ = run(model, requests[:1], num_blocks=64, max_num_batched_tokens=64)
    # Cached first: "a" again must still get every prompt position (no prefix reuse for it).
    warm = [
        make_engine_request("warm", requests[0].prompt_token_ids, 2, ignore_eos=True),
        *requests,
    ]
    # Chunks of at most 8 tokens, and too few blocks for both: "b" is preempted in its prefill,
    # after some of its prompt logprobs were computed (and recomputed from its first token).
    chunked, num_preemptions = run(model, warm, num_blocks=14, max_num_batched_tokens=8)
    assert num_preemptions > 0
    for request_id, num_prompt in (("a", 22), ("b", 40)):
        outputs = chunked[request_id]
        assert len(outputs[0].prompt_logprobs) == num_prompt - 1
        assert all(not o.prompt_logprobs for o in outputs[1:])
        assert [len(o.logprobs) for o in outputs] == [1] * 12
        for o in outputs:
            entry = o.logprobs[0]
            assert (entry.chosen.token_id, entry.rank) == (o.new_token_ids[0], 1)  # greedy
            assert entry.top[0] == TokenLogprob(entry.chosen.token_id, entry.chosen.logprob)
        prompt = [e.chosen.token_id for e in outputs[0].prompt_logprobs]
        source = next(r for r in requests if r.request_id == request_id)
        assert prompt == list(source.prompt_token_ids[1:])
    assert_close(list(chunked["a"][0].prompt_logprobs), list(alone["a"][0].prompt_logprobs))
    assert_close([o.logprobs[0] for o in chunked["a"]], [o.logprobs[0] for o in alone["a"]])
