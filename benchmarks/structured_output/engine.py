"""The engine part of :mod:`benchmarks.structured_output.compare`: decode throughput of free and
constrained requests on stories260K, in this process, and the sampler's waits on masks.

The engine steps on this thread; besides wall-clock tokens per second (at the mercy of whatever
else runs on the machine) it reports this thread's CPU time per decode token, whose difference
between a free and a constrained run is the cost structured output adds to the engine's critical
path (the masks themselves are computed on the workers)."""

from __future__ import annotations

import json
import statistics
import time

from zerolayer.bench.inprocess import LocalModel, build_local_engine
from zerolayer.checkpoints.default_model import ensure_default_model
from zerolayer.common.generation import EngineRequest, SamplingParams, StructuredOutput
from zerolayer.scheduler.core.engine import Engine
from zerolayer.scheduler.core.engine_commands import AddRequest
from zerolayer.scheduler.engine_factory import EngineConfig

NUM_REQUESTS = 8
MAX_NEW_TOKENS = 128
ROUNDS = 5
PROMPT = (1, 403, 407, 261, 378)
"""BOS "Once upon a time" in stories260K's tokenizer."""
STORY_TEXT = StructuredOutput("regex", "[A-Za-z ,.!?'\"\n]+")
"""Story-like text (what greedy stories260K writes anyway): the mask runs, the text is alike."""


def run(engine: Engine, constraint: StructuredOutput | None, temperature: float) -> dict:
    """Decodes NUM_REQUESTS requests together; tokens per second of the decode steps."""
    outputs: dict[str, int] = {}
    for i in range(NUM_REQUESTS):
        request = EngineRequest(
            f"r{i}",
            PROMPT,
            MAX_NEW_TOKENS,
            SamplingParams(temperature=temperature, seed=i),
            ignore_eos=constraint is None,
            structured_output=constraint,
        )
        outputs[request.request_id] = 0

        def sink(result: object, request_id: str = request.request_id) -> None:
            assert not isinstance(result, Exception), result
            outputs[request_id] += len(result.new_token_ids)  # type: ignore[attr-defined]

        engine.apply(AddRequest(request, sink))
    engine.step()  # prefill (and the first token)
    grammar = engine.grammar
    assert grammar is not None
    waits_before, masks_before = grammar.mask_wait_s, grammar.num_masks
    consume_before = grammar.consume_s
    first = sum(outputs.values())
    start, start_cpu = time.perf_counter(), time.thread_time()
    while engine.scheduler.has_unfinished_requests:
        engine.step()
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    num_tokens = sum(outputs.values()) - first
    num_masks = grammar.num_masks - masks_before
    return {
        "decode_tokens": num_tokens,
        "decode_tok_s": num_tokens / elapsed,
        "engine_thread_cpu_us_per_token": cpu / num_tokens * 1e6,
        "mask_wait_us_mean": (grammar.mask_wait_s - waits_before) / max(num_masks, 1) * 1e6,
        "consume_us_mean": (grammar.consume_s - consume_before) / max(num_masks, 1) * 1e6,
    }


def engine_overhead() -> dict:
    """Free, regex and JSON-schema decoding, alternating, ROUNDS times each after a warm-up
    round; medians."""
    model = LocalModel.load(ensure_default_model())
    config = EngineConfig(max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=256)
    engine, _ = build_local_engine(model, config, model.arena_layout_of_blocks(16, 256))
    from benchmarks.structured_output.compare import SCHEMA

    cases = {
        "free (greedy)": (None, 0.0),
        "regex, story text (greedy)": (STORY_TEXT, 0.0),
        "free (temperature 1)": (None, 1.0),
        "JSON schema (temperature 1)": (StructuredOutput("json_schema", json.dumps(SCHEMA)), 1.0),
    }
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    for round_ in range(ROUNDS + 1):  # cases alternate; round 0 warms up
        for name, (constraint, temperature) in cases.items():
            result = run(engine, constraint, temperature)
            if round_ > 0:
                runs[name].append(result)
    results = {}
    for name, samples in runs.items():
        results[name] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    assert engine.grammar is not None
    engine.grammar.close()
    return results
