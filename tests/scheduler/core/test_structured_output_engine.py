"""The engine with structured output on stories260K in this process: masks applied to every
sampled row, a preempted request recomputed without consuming its tokens twice, and a matcher
failure ending the request with its error instead of a token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.default_model import write_default_model
from zerolayer.common.errors import InvalidArgument, Unavailable
from zerolayer.common.generation import (
    EngineRequest,
    FinishReason,
    RequestOutput,
    SamplingParams,
    StructuredOutput,
)
from zerolayer.scheduler.core.engine_commands import AbortRequest, AddRequest, FailAll
from zerolayer.scheduler.engine_factory import EngineConfig

BLOCK_SIZE = 16
WORDS = "(?:[a-z]+ ){12}end"
"""Twelve words then "end": long enough that three requests outgrow a small arena."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_default_model(tmp_path_factory.mktemp("stories260K")))


def run(model_dir: Path, num_blocks: int, requests: list[EngineRequest]):
    model = LocalModel.load(model_dir)
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=128)
    layout = model.arena_layout_of_blocks(BLOCK_SIZE, num_blocks)
    engine, _ = build_local_engine(model, config, layout, enable_prefix_caching=False)
    outputs: dict[str, list[RequestOutput | Exception]] = {r.request_id: [] for r in requests}
    for request in requests:
        engine.apply(AddRequest(request, outputs[request.request_id].append))
    for _ in range(2000):
        if not engine.has_unfinished_requests:
            break
        engine.step()
    assert engine.grammar is not None
    engine.grammar.close()
    return engine, outputs


def text_of(model_dir: Path, results: list) -> tuple[str, FinishReason]:
    ids = [t for r in results for t in r.new_token_ids]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.decode(ids), results[-1].finish_reason


def test_preempted_constrained_requests_match_and_equal_an_unpreempted_run(
    model_dir: Path,
) -> None:
    prompt = tuple([1, *range(300, 330)])  # 31 tokens: 2 blocks each, up to 6 with the output
    requests = [
        EngineRequest(
            f"r{i}",
            prompt,
            64,
            SamplingParams(temperature=1.0, seed=i),
            structured_output=StructuredOutput("regex", WORDS),
        )
        for i in range(3)
    ]
    small, preempted = run(model_dir, 7, requests)
    large, reference = run(model_dir, 64, requests)
    assert small.scheduler.num_preemptions > 0
    assert large.scheduler.num_preemptions == 0
    for request in requests:
        text, reason = text_of(model_dir, preempted[request.request_id])
        assert re.fullmatch(WORDS, text), text
        assert reason == FinishReason.EOS
        # Recomputing does not advance the matcher: the same tokens as without preemption.
        assert (text, reason) == text_of(model_dir, reference[request.request_id])


def test_a_grammar_the_tokenizer_cannot_serve_ends_the_request_with_its_error(
    model_dir: Path,
) -> None:
    bad = EngineRequest(
        "bad",
        (1, 403),
        20,
        SamplingParams(),
        structured_output=StructuredOutput("grammar", 'start: <[9999]> "a"'),
    )
    good = EngineRequest("good", (1, 403), 5, SamplingParams(), ignore_eos=True)
    _, outputs = run(model_dir, 16, [bad, good])
    assert len(outputs["bad"]) == 1
    error = outputs["bad"][0]
    assert isinstance(error, InvalidArgument)
    assert error.field == "structured_output.grammar"
    assert sum(len(r.new_token_ids) for r in outputs["good"]) == 5


def constrained(request_id: str, prompt: tuple[int, ...], seed: int, **fields) -> EngineRequest:
    return EngineRequest(
        request_id,
        prompt,
        64,
        SamplingParams(temperature=1.0, seed=seed),
        structured_output=StructuredOutput("regex", WORDS),
        **fields,
    )


def test_each_of_n_samples_follows_the_grammar_as_a_lone_request_would(model_dir: Path) -> None:
    prompt = tuple([1, *range(300, 320)])
    _, forked = run(model_dir, 64, [constrained("r", prompt, 5, n=3)])
    _, alone = run(model_dir, 64, [constrained(f"s{i}", prompt, 5 + i) for i in range(3)])
    for index in range(3):
        sample = [o for o in forked["r"] if o.index == index]
        text, reason = text_of(model_dir, sample)
        assert re.fullmatch(WORDS, text), text
        assert reason == FinishReason.EOS
        assert text_of(model_dir, alone[f"s{index}"]) == (text, reason)


def test_a_resubmitted_request_continues_the_grammar_where_it_was(model_dir: Path) -> None:
    # A failover resubmission: the prompt ends with the first 10 output tokens, which the new
    # matcher must consume before it masks the 11th; then the tokens are the undisturbed run's.
    prompt = tuple([1, *range(300, 320)])
    _, whole = run(model_dir, 64, [constrained("r", prompt, 9)])
    ids = [t for o in whole["r"] for t in o.new_token_ids]
    resumed = constrained("r2", (*prompt, *ids[:10]), 9, num_resumed_output_tokens=10)
    _, rest = run(model_dir, 64, [resumed])
    assert [t for o in rest["r2"] for t in o.new_token_ids] == ids[10:]
    assert rest["r2"][-1].finish_reason == FinishReason.EOS


def test_a_request_waits_outside_the_batch_while_its_grammar_compiles(model_dir: Path) -> None:
    """Until its grammar is compiled the request is not in the scheduler; an abort then
    forgets it (its sink gets nothing) and a failure of the engine ends it with the error."""
    model = LocalModel.load(model_dir)
    layout = model.arena_layout_of_blocks(BLOCK_SIZE, 16)
    engine, _ = build_local_engine(model, EngineConfig(), layout, enable_prefix_caching=False)
    assert engine.grammar is not None
    outputs: dict[str, list] = {"aborted": [], "failed": []}
    for request_id in outputs:
        engine.apply(AddRequest(constrained(request_id, (1, 403), 1), outputs[request_id].append))
    assert len(engine.compiling) == 2 and engine.scheduler.num_waiting == 0
    assert engine.has_unfinished_requests and engine.num_streams == 2
    engine.apply(AbortRequest("aborted"))
    engine.apply(FailAll(Unavailable("gpu lost")))
    assert not engine.has_unfinished_requests and engine.num_streams == 0
    assert outputs["aborted"] == []
    assert [str(e) for e in outputs["failed"]] == ["gpu lost"]
    engine.grammar.close()
