"""Tests for the persistent step input buffers: same contents as a from-scratch construction, the
same storage from step to step, growth when a step exceeds the capacity."""

from __future__ import annotations

import random

import torch
from factories import make_request

from zerolayer.scheduler.core.request import Request
from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.model.step_inputs import StepBuffers

BLOCK_SIZE = 4


def random_request(rng: random.Random, num_prompt: int, num_output: int) -> Request:
    """A request of random prompt and output tokens, holding random blocks."""
    request_id = str(rng.random())
    prompt = [rng.randrange(1000) for _ in range(num_prompt)]
    output = [rng.randrange(1000) for _ in range(num_output)]
    block_ids = rng.sample(range(200), -(-(num_prompt + num_output) // BLOCK_SIZE))
    return make_request(request_id, prompt, block_ids, output, max_new_tokens=num_output + 1)


def random_step(rng: random.Random, max_seqs: int = 6) -> SchedulerOutput:
    scheduled = []
    for _ in range(rng.randint(1, max_seqs)):
        num_prompt, num_output = rng.randint(1, 30), rng.randint(0, 10)
        request = random_request(rng, num_prompt, num_output)
        total = num_prompt + num_output
        if rng.random() < 0.5:
            first, n = total - 1, 1  # decode
        else:
            first = rng.randint(0, total - 1)
            n = total - first  # prefill chunk, may cross from prompt into output tokens
        scheduled.append(ScheduledRequest(request, first, n, samples=rng.random() < 0.8))
    return SchedulerOutput(scheduled)


def expected(output: SchedulerOutput) -> dict[str, list]:
    """The step's inputs built naively from Python lists."""
    ids, positions, slots, rows, decode_rows, decode_lens = [], [], [], [], [], []
    qsl, seq_lens, tables, decode_tables = [0], [], [], []
    for item in output.scheduled:
        request = item.request
        tokens = request.all_token_ids
        first, end = item.num_computed_tokens, item.num_computed_tokens + item.num_new_tokens
        start = len(ids)
        ids += tokens[first:end]
        positions += range(first, end)
        slots += [
            request.block_ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
            for p in range(first, end)
        ]
        table = request.block_ids[: -(-end // BLOCK_SIZE)]
        tables.append(table)
        qsl.append(len(ids))
        seq_lens.append(end)
        if item.num_new_tokens == 1:
            decode_rows.append(start)
            decode_lens.append(end)
            decode_tables.append(table)
        if item.samples:
            rows.append(len(ids) - 1)

    def pad(ts: list[list[int]]) -> list[list[int]]:
        width = max((len(t) for t in ts), default=0)
        return [t + [0] * (width - len(t)) for t in ts]

    width = max((len(t) for t in decode_tables), default=0)
    mask = [[p < n for p in range(width * BLOCK_SIZE)] for n in decode_lens]
    return dict(
        input_ids=ids,
        positions=positions,
        slot_mapping=slots,
        logits_rows=rows,
        decode_rows=decode_rows,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_tables=pad(tables),
        decode_block_tables=pad(decode_tables),
        decode_mask=mask,
    )


def test_fill_matches_a_from_scratch_construction_over_random_steps() -> None:
    rng = random.Random(0)
    buffers = StepBuffers(BLOCK_SIZE, max_tokens=512, max_seqs=8, max_blocks=16)
    for _ in range(200):
        output = random_step(rng)
        inputs = buffers.fill(output)
        want = expected(output)
        meta = inputs.meta
        assert inputs.input_ids.tolist() == want["input_ids"]
        assert inputs.positions.tolist() == want["positions"]
        assert inputs.logits_rows.tolist() == want["logits_rows"]
        assert meta.slot_mapping.tolist() == want["slot_mapping"]
        assert meta.decode_rows.tolist() == want["decode_rows"]
        assert meta.query_start_loc.tolist() == want["query_start_loc"]
        assert meta.seq_lens.tolist() == want["seq_lens"]
        assert meta.block_tables.tolist() == want["block_tables"]
        assert meta.decode_block_tables.tolist() == want["decode_block_tables"]
        assert meta.decode_mask.flatten(1).tolist() == want["decode_mask"]
        assert meta.block_tables.is_contiguous() and meta.decode_block_tables.is_contiguous()
        for span in meta.prefills:
            b = meta.query_start_loc.tolist().index(span.start)
            assert span.block_ids.tolist() == want["block_tables"][b][: len(span.block_ids)]
            assert span.seq_len == want["seq_lens"][b]


def test_steps_reuse_the_same_storage() -> None:
    rng = random.Random(1)
    buffers = StepBuffers(BLOCK_SIZE, max_tokens=512, max_seqs=8, max_blocks=16)
    first = buffers.fill(random_step(rng))
    pointers = {
        "input_ids": first.input_ids.data_ptr(),
        "positions": first.positions.data_ptr(),
        "slot_mapping": first.meta.slot_mapping.data_ptr(),
        "block_tables": first.meta.block_tables.data_ptr(),
        "seq_lens": first.meta.seq_lens.data_ptr(),
    }
    for _ in range(50):
        inputs = buffers.fill(random_step(rng))
        assert inputs.input_ids.data_ptr() == pointers["input_ids"]
        assert inputs.positions.data_ptr() == pointers["positions"]
        assert inputs.meta.slot_mapping.data_ptr() == pointers["slot_mapping"]
        assert inputs.meta.block_tables.data_ptr() == pointers["block_tables"]
        assert inputs.meta.seq_lens.data_ptr() == pointers["seq_lens"]


def test_a_step_larger_than_the_buffers_grows_them() -> None:
    rng = random.Random(2)
    buffers = StepBuffers(BLOCK_SIZE, max_tokens=2, max_seqs=1, max_blocks=1)
    output = random_step(rng, max_seqs=12)
    while len(output.scheduled) < 3:
        output = random_step(rng, max_seqs=12)
    inputs = buffers.fill(output)
    assert inputs.input_ids.tolist() == expected(output)["input_ids"]
    assert inputs.meta.block_tables.tolist() == expected(output)["block_tables"]
    assert buffers.max_seqs >= len(output.scheduled)


def test_request_token_access_matches_the_concatenated_list() -> None:
    rng = random.Random(3)
    request = random_request(rng, 7, 5)
    tokens = request.all_token_ids
    assert [request.token_at(i) for i in range(12)] == tokens
    for first in range(12):
        for end in range(first, 13):
            assert request.token_slice(first, end) == tokens[first:end]


def test_empty_step_gives_empty_inputs() -> None:
    inputs = StepBuffers(BLOCK_SIZE).fill(SchedulerOutput([]))
    assert inputs.input_ids.numel() == 0 and inputs.logits_rows.numel() == 0
    assert inputs.meta.query_start_loc.tolist() == [0]
    assert torch.equal(inputs.meta.block_tables, torch.zeros(0, 0, dtype=torch.int64))
