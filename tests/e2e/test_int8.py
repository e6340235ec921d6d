"""End to end on an int8 copy of the tiny dummy model (``zerolayer quantize``): the real stack
serves it, and its greedy tokens follow the unquantized model's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from e2e.stack import generate_ids, running_stack, text_stub
from factories import MAX_NEW_TOKENS, generate

from zerolayer.bench.inprocess import local_engine_for_stack
from zerolayer.checkpoints.quantize import quantize_checkpoint

pytestmark = pytest.mark.e2e

PROMPTS = [[1, 72, 101, 108, 108, 111], [1, *range(3, 60)], [1, 50, 60], [1, *[80] * 33]]


@pytest.fixture(scope="module")
def source_dir(dummy_model_dir: Path) -> Path:
    return dummy_model_dir


@pytest.fixture(scope="module")
def stack(source_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    int8_dir = tmp_path_factory.mktemp("int8") / "tiny-int8"
    quantize_checkpoint(source_dir, int8_dir)
    with running_stack(int8_dir, tmp_path_factory.mktemp("logs")) as stack:
        yield stack


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_greedy_tokens_follow_the_unquantized_model(stack, source_dir: Path) -> None:
    stub = text_stub(stack)
    served = [list(generate_ids(stub, ids, MAX_NEW_TOKENS, "int8").token_ids) for ids in PROMPTS]
    # The same engine in this process, on the unquantized float32 checkpoint.
    reference = local_engine_for_stack(dataclasses.replace(stack.config, model_dir=str(source_dir)))
    unquantized = [generate(reference, [ids], tag=f"f{i}-")[0] for i, ids in enumerate(PROMPTS)]
    assert [len(ids) for ids in served] == [MAX_NEW_TOKENS] * len(PROMPTS)
    agreed = [common_prefix(a, b) for a, b in zip(served, unquantized, strict=True)]
    # Greedy paths part once two logits swap; 8-bit weights and activations keep most of them.
    assert sum(agreed) >= 0.6 * MAX_NEW_TOKENS * len(PROMPTS), agreed
    assert min(agreed) >= 4, agreed


def test_the_in_process_engine_on_the_int8_checkpoint_gives_the_stacks_ids(stack) -> None:
    # Same weights, same kernels: the served int8 path is the one this process computes.
    engine = local_engine_for_stack(stack.config)
    in_process = [generate(engine, [ids], tag=f"q{i}-")[0] for i, ids in enumerate(PROMPTS)]
    stub = text_stub(stack)
    served = [list(generate_ids(stub, ids, MAX_NEW_TOKENS, "int8-b").token_ids) for ids in PROMPTS]
    assert served == in_process
