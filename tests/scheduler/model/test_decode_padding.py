"""Tests for the host side of decode CUDA graphs: batch sizes, buckets, the padding slot, the
padded input image, and the device-input copy and model device checks that run without CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import make_request

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.model.decode_padding import (
    DecodeStaging,
    bucket_for,
    graph_batch_sizes,
    is_decode_only,
    padding_slot,
)
from zerolayer.scheduler.model.device_inputs import DeviceInputs
from zerolayer.scheduler.model.llama import LlamaModel
from zerolayer.scheduler.model.model_runner import ModelRunner
from zerolayer.scheduler.model.step_inputs import StepBuffers, StepInputs

BLOCK_SIZE = 4


TINY_CONFIG = ModelConfig.from_json(
    '{"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,'
    ' "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 128,'
    ' "max_position_embeddings": 16}'
)


def make_tiny_weights(seed: int | None = None) -> dict[str, torch.Tensor]:
    """Weights of :data:`TINY_CONFIG` (head_dim 4) on the CPU: zeros, or seeded normal values."""
    shapes = {
        "model.embed_tokens.weight": (128, 8),
        "model.norm.weight": (8,),
        "lm_head.weight": (128, 8),
        "model.layers.0.input_layernorm.weight": (8,),
        "model.layers.0.self_attn.q_proj.weight": (8, 8),
        "model.layers.0.self_attn.k_proj.weight": (4, 8),
        "model.layers.0.self_attn.v_proj.weight": (4, 8),
        "model.layers.0.self_attn.o_proj.weight": (8, 8),
        "model.layers.0.post_attention_layernorm.weight": (8,),
        "model.layers.0.mlp.gate_proj.weight": (16, 8),
        "model.layers.0.mlp.up_proj.weight": (16, 8),
        "model.layers.0.mlp.down_proj.weight": (8, 16),
    }
    if seed is None:
        return {name: torch.zeros(shape) for name, shape in shapes.items()}
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def make_decode_step(seq_lens: list[int], tables: list[list[int]]) -> StepInputs:
    """A decode-only step: sequence i feeds its token at position ``seq_lens[i] - 1``."""
    scheduled = [
        ScheduledRequest(make_request(str(i), range(100, 100 + n), table), n - 1, 1, samples=True)
        for i, (n, table) in enumerate(zip(seq_lens, tables, strict=True))
    ]
    buffers = StepBuffers(BLOCK_SIZE, max_tokens=16, max_seqs=8, max_blocks=8)
    return buffers.fill(SchedulerOutput(scheduled))


def test_graph_batch_sizes_are_capped_at_max_num_seqs() -> None:
    assert graph_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_batch_sizes(256) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert graph_batch_sizes(3) == (1, 2, 3)
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(10, sizes=(8, 1, 4)) == (1, 4, 8)
    with pytest.raises(ValueError):
        graph_batch_sizes(0)


def test_bucket_is_the_smallest_batch_size_that_holds_the_step() -> None:
    sizes = (1, 2, 4, 8, 16, 32, 48)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 4, 5, 17, 33, 48)] == [
        1,
        2,
        4,
        4,
        8,
        32,
        48,
        48,
    ]
    assert bucket_for(49, sizes) is None


def test_decode_only_means_one_token_per_sequence() -> None:
    assert is_decode_only(make_decode_step([5, 9], [[7, 3], [1, 2, 6]]))
    prefill = ScheduledRequest(make_request("p", range(100, 106), [4, 5]), 0, 6, samples=True)
    mixed = StepBuffers(BLOCK_SIZE).fill(SchedulerOutput([prefill]))
    assert not is_decode_only(mixed)
    assert not is_decode_only(StepBuffers(BLOCK_SIZE).fill(SchedulerOutput([])))


def test_padding_slot_follows_the_first_token_that_is_not_last_in_its_block() -> None:
    # Positions 3 (last of block 9) and 5 (offset 1 of block 2): slot 2 * 4 + 1, plus one.
    step = make_decode_step([4, 6], [[9, 7], [1, 2]])
    assert step.meta.slot_mapping.tolist() == [9 * 4 + 3, 2 * 4 + 1]
    assert padding_slot(step, BLOCK_SIZE) == 2 * 4 + 2
    # Position 0 of block 5: the next slot of that block.
    assert padding_slot(make_decode_step([1], [[5]]), BLOCK_SIZE) == 5 * 4 + 1


def test_no_padding_slot_when_every_token_ends_its_block() -> None:
    step = make_decode_step([4, 8], [[9], [1, 3]])
    assert padding_slot(step, BLOCK_SIZE) is None


def test_staging_pads_a_decode_step_to_its_bucket() -> None:
    step = make_decode_step([4, 6, 2], [[9], [1, 2], [5]])
    staging = DecodeStaging(max_batch=8)
    staging.buffer.fill_(-7)  # what an earlier step left behind
    staging.write(step, batch=4, pad_slot=10)
    views = {k: v.tolist() for k, v in staging.views(staging.buffer, 4).items()}
    assert views == {
        "input_ids": [103, 105, 101, 0],
        "positions": [3, 5, 1, 0],
        "slot_mapping": [9 * 4 + 3, 2 * 4 + 1, 5 * 4 + 1, 10],
        "seq_lens": [4, 6, 2, 0],
        "logits_rows": [0, 1, 2, -7],
        "query_start_loc": [0, 1, 2, 3, 3],
    }
    # Rows past the bucket are not the graph's: left as they were.
    assert staging.views(staging.buffer, 8)["input_ids"].tolist()[4:] == [-7] * 4


def test_padded_step_writes_only_the_padding_slot_and_keeps_the_real_logits() -> None:
    # The padded forward as a graph runs it, with the CPU reference attention standing in for
    # Triton (its decode fields cover the real rows; padding rows' outputs are garbage).
    model = LlamaModel(TINY_CONFIG, make_tiny_weights(seed=0))
    arena = torch.randn(1, 2, 12, BLOCK_SIZE, 1, 4, generator=torch.Generator().manual_seed(1))
    step = make_decode_step([4, 6, 2], [[9], [1, 2], [5]])
    unpadded = arena.clone()
    want = model.compute_logits(
        model.forward(step.input_ids, step.positions, [(unpadded[0, 0], unpadded[0, 1])], step.meta)
    )

    pad = padding_slot(step, BLOCK_SIZE)
    assert pad == 2 * 4 + 2  # sequence 1 is at position 5 (block 2, offset 1); it reads 0..5
    staging = DecodeStaging(max_batch=8)
    staging.write(step, batch=4, pad_slot=pad)
    s = staging.views(staging.buffer, 4)
    padded = arena.clone()
    meta = dataclasses.replace(
        step.meta,
        slot_mapping=s["slot_mapping"],
        query_start_loc=s["query_start_loc"],
        seq_lens=s["seq_lens"],
        block_tables=torch.cat((step.meta.block_tables, torch.zeros(1, 2, dtype=torch.int64))),
    )
    kv = [(padded[0, 0], padded[0, 1])]
    got = model.compute_logits(model.forward(s["input_ids"], s["positions"], kv, meta))

    torch.testing.assert_close(got[:3], want, rtol=1e-5, atol=1e-5)
    per_slot = (padded != unpadded).view(2, 12 * BLOCK_SIZE, -1)  # K and V, slot, Hkv * D
    assert per_slot.any(-1).any(0).nonzero().flatten().tolist() == [pad]


def test_staging_layout_has_one_section_per_input() -> None:
    staging = DecodeStaging(max_batch=4)
    assert staging.buffer.numel() == 6 * 4 + 1
    staging.buffer.copy_(torch.arange(25))
    views = staging.views(staging.buffer, 2)
    assert views["input_ids"].tolist() == [0, 1]
    assert views["positions"].tolist() == [4, 5]
    assert views["query_start_loc"].tolist() == [20, 21, 22]
    assert all(v.is_contiguous() for v in views.values())


def test_capture_image_is_one_token_per_sequence() -> None:
    staging = DecodeStaging(max_batch=4)
    staging.buffer.fill_(-1)
    staging.write_capture(3)
    views = {k: v.tolist() for k, v in staging.views(staging.buffer, 3).items()}
    assert views == {
        "input_ids": [0, 0, 0],
        "positions": [0, 0, 0],
        "slot_mapping": [0, 0, 0],
        "seq_lens": [1, 1, 1],
        "logits_rows": [0, 1, 2],
        "query_start_loc": [0, 1, 2, 3],
    }


@pytest.mark.parametrize("reference_attention", [False, True])
def test_device_inputs_copy_the_step_and_grow(reference_attention: bool) -> None:
    # On the CPU as a stand-in device: the copy logic does not depend on the device.
    inputs = make_decode_step([4, 6, 2], [[9], [1, 2], [5]])
    device_inputs = DeviceInputs(
        torch.device("cpu"),
        max_tokens=1,
        max_seqs=1,
        max_blocks=1,
        reference_attention=reference_attention,
    )
    copied = device_inputs.copy(inputs)
    assert copied.input_ids.tolist() == [103, 105, 101]
    assert copied.positions.tolist() == [3, 5, 1]
    assert copied.logits_rows.tolist() == [0, 1, 2]
    assert copied.meta.block_tables.tolist() == [[9, 0], [1, 2], [5, 0]]
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        ours, theirs = getattr(copied.meta, name), getattr(inputs.meta, name)
        assert torch.equal(ours, theirs) and ours.data_ptr() != theirs.data_ptr(), name
    assert copied.input_ids.data_ptr() != inputs.input_ids.data_ptr()
    assert torch.equal(copied.meta.decode_mask, inputs.meta.decode_mask)
    assert torch.equal(copied.meta.decode_block_tables, inputs.meta.decode_block_tables)
    # The next (smaller) step reuses the grown buffers.
    again = device_inputs.copy(make_decode_step([3], [[8]]))
    assert again.input_ids.data_ptr() == copied.input_ids.data_ptr()
    assert again.meta.block_tables.tolist() == [[8]]


def test_model_rejects_weights_on_several_devices() -> None:
    weights = make_tiny_weights()
    model = LlamaModel(TINY_CONFIG, weights)
    assert model.device == torch.device("cpu") and model.rotary.cos.device == model.device
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(16, 8, device="meta")
    with pytest.raises(ValueError, match="meta"):
        LlamaModel(TINY_CONFIG, weights)


def test_cpu_runner_keeps_its_buffers_and_captures_nothing() -> None:
    model = LlamaModel(TINY_CONFIG, make_tiny_weights())
    arena = torch.zeros(1, 2, 4, BLOCK_SIZE, 1, 4)
    buffers = StepBuffers(BLOCK_SIZE)
    runner = ModelRunner(model, arena, BLOCK_SIZE, buffers=buffers, graph_sizes=(1, 2))
    assert runner.buffers is buffers and not buffers.pin_memory
    assert runner.graphs is None and runner.device_inputs is None
    assert runner.capture_graphs() == 0
    with pytest.raises(ValueError, match="meta"):
        runner.set_arena(torch.zeros(1, 2, 4, BLOCK_SIZE, 1, 4, device="meta"))
