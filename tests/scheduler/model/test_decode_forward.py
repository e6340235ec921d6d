"""The fused native decode step (csrc/decode_forward.cpp) against the layer-by-layer forward it
replaces, on a small bfloat16 model: several sequences at once, shuffled block tables."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import DummyPreset, write_dummy_model
from zerolayer.checkpoints.quantize import quantize_checkpoint
from zerolayer.scheduler.model.attention import AttentionMetadata, PrefillSpan
from zerolayer.scheduler.model.decode_forward import ThreadChoice, unsupported_reason
from zerolayer.scheduler.model.int8_linear import Int8Weight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.layer_ops import rms_norm
from zerolayer.scheduler.model.llama import LlamaModel

PRESET = DummyPreset(128, 256, 2, 4, 2, 259, dtype="bfloat16")
BLOCK_SIZE = 4
NUM_BLOCKS = 64


def metadata(lengths: list[int], tables: list[list[int]], fed: list[int]) -> AttentionMetadata:
    """Sequence s feeds ``fed[s]`` tokens ending at position ``lengths[s] - 1``, its K/V in the
    blocks ``tables[s]`` (in order)."""
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    slots, spans, starts = [], [], [0]
    for s, (length, n) in enumerate(zip(lengths, fed, strict=True)):
        for p in range(length - n, length):
            slots.append(tables[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE)
        used = torch.tensor(tables[s][: -(-length // BLOCK_SIZE)])
        spans.append(PrefillSpan(starts[-1], n, length, used))
        starts.append(starts[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        decode_rows=torch.zeros(0, dtype=torch.int64),
        decode_block_tables=torch.zeros(0, 1, dtype=torch.int64),
        decode_mask=torch.zeros(0, 1, 1, BLOCK_SIZE, dtype=torch.bool),
        prefills=tuple(spans),
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(lengths),
        block_tables=padded,
    )


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bfloat16 model and its int8 copy (zerolayer quantize, groups of 32)."""
    bf16 = write_dummy_model(tmp_path_factory.mktemp("bf16"), PRESET, seed=7)
    int8 = tmp_path_factory.mktemp("int8") / "model"
    quantize_checkpoint(bf16, int8)
    return {"bf16": bf16, "int8": int8}


@pytest.fixture(scope="module")
def local(model_dirs: dict[str, Path]) -> LocalModel:
    return LocalModel.load(model_dirs["bf16"])


def empty_caches(model: LlamaModel) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (NUM_BLOCKS, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    return [
        (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
        for _ in model.layers
    ]


def prefilled(model: LlamaModel, native: KernelLoader, prompts: list[list[int]], tables):
    """Caches holding each prompt's K/V, written layer by layer (prompts longer than 4)."""
    caches = empty_caches(model)
    for prompt, table in zip(prompts, tables, strict=True):
        meta = metadata([len(prompt)], [table], [len(prompt)])
        model.forward(torch.tensor(prompt), torch.arange(len(prompt)), caches, meta, native)
    return caches


def layer_by_layer(local: LocalModel) -> LlamaModel:
    model = LlamaModel(local.config, local.weights)
    model._fused_decode_checked = True  # never builds the fused step
    return model


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("num_seqs", [1, 2, 3, 4])
def test_fused_decode_steps_match_the_layer_by_layer_forward(
    native: KernelLoader, model_dirs: dict[str, Path], num_seqs: int, weights: str
) -> None:
    local = LocalModel.load(model_dirs[weights])
    fused_model, plain_model = LlamaModel(local.config, local.weights), layer_by_layer(local)
    assert_fused_steps_match(native, fused_model, plain_model, num_seqs)


def assert_fused_steps_match(
    native: KernelLoader, fused_model: LlamaModel, plain_model: LlamaModel, num_seqs: int
) -> None:
    """Six decode steps of num_seqs sequences (prefilled layer by layer, shuffled block tables)
    through the fused model and the layer-by-layer one, each fed the reference's greedy token:
    the first layer's K/V equal bit for bit, the hidden states within bfloat16 roundings, 90%
    of the argmaxes equal."""
    gen = torch.Generator().manual_seed(num_seqs)
    order = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    lengths = [5 + 7 * s for s in range(num_seqs)]
    tables = [order[16 * s : 16 * (s + 1)] for s in range(num_seqs)]
    prompts = [torch.randint(3, 259, (n,), generator=gen).tolist() for n in lengths]
    fused_caches = prefilled(plain_model, native, prompts, tables)
    plain_caches = [(k.clone(), v.clone()) for k, v in fused_caches]
    tokens = [p[-1] for p in prompts]
    agree = 0
    with torch.inference_mode():
        for step in range(6):
            positions = [n + step for n in lengths]
            meta = metadata([p + 1 for p in positions], tables, [1] * num_seqs)
            ids, pos = torch.tensor(tokens), torch.tensor(positions)
            fused = fused_model.forward(ids, pos, fused_caches, meta, native)
            plain = plain_model.forward(ids, pos, plain_caches, meta, native)
            # the first layer's K/V come from the same GEMV (int8, GGUF: the same quantized x)
            # and norm: equal bit for bit
            assert torch.equal(fused_caches[0][0], plain_caches[0][0])
            assert torch.equal(fused_caches[0][1], plain_caches[0][1])
            # after that, attention's float32 sums run in another order: bfloat16 roundings
            torch.testing.assert_close(fused, plain, atol=0.1, rtol=0.05)
            logits = fused_model.compute_logits(fused, native)
            reference = plain_model.compute_logits(plain, native)
            agree += int((logits.argmax(-1) == reference.argmax(-1)).sum())
            tokens = reference.argmax(-1).tolist()
    assert fused_model._fused_decode is not None
    assert agree >= 0.9 * 6 * num_seqs


def test_fused_decode_refuses_bad_slots_before_writing(
    native: KernelLoader, local: LocalModel
) -> None:
    model = LlamaModel(local.config, local.weights)
    caches = prefilled(model, native, [[1, 2, 3, 4, 5]], [[3, 9]])
    fused = model._fused_decode_for(native)
    assert fused is not None
    before = [(k.clone(), v.clone()) for k, v in caches]
    meta = metadata([6], [[3, 9]], [1])
    h = torch.zeros(1, PRESET.hidden_size, dtype=torch.bfloat16)
    cos, sin = model.rotary.tables(torch.tensor([5]), torch.bfloat16)
    bad_slot = dataclasses.replace(meta, slot_mapping=torch.tensor([0]))
    with pytest.raises(RuntimeError, match="not the sequence's last position"):
        fused(h, caches, bad_slot, cos, sin)
    bad_block = dataclasses.replace(meta, block_tables=torch.tensor([[3, NUM_BLOCKS]]))
    with pytest.raises(RuntimeError, match="out of range"):
        fused(h, caches, bad_block, cos, sin)
    assert all(
        torch.equal(a, b)
        for pair in zip(caches, before, strict=True)
        for a, b in zip(*pair, strict=True)
    )


def test_only_the_standard_bfloat16_llama_on_the_cpu_is_fused(local: LocalModel) -> None:
    model = LlamaModel(local.config, local.weights)
    cfg, layers = model.config, model.layers

    def reason(**changes) -> str | None:
        args = {"dtype": torch.bfloat16, "device": torch.device("cpu"), "act": F.silu}
        args.update(changes)
        return unsupported_reason(
            cfg, args.pop("layers", layers), norm=args.pop("norm", rms_norm), **args
        )

    assert reason() is None
    assert reason(dtype=torch.float32) is not None
    assert reason(act=F.gelu) is not None
    assert reason(norm=lambda x, w, eps: x) is not None
    mixed = [
        dataclasses.replace(
            layers[0],
            o_proj=Int8Weight(layers[0].o_proj.to(torch.int8), torch.ones(PRESET.hidden_size, 4)),
        )
    ]
    assert reason(layers=mixed) == "weights neither all bfloat16 or GGUF nor all int8"
    biased = [dataclasses.replace(layers[0], o_bias=torch.zeros(PRESET.hidden_size))]
    assert reason(layers=biased) == "biases or extra norms"
    fused_qkv = [dataclasses.replace(layers[0], qkv=(layers[0].qkv[0],))]
    assert reason(layers=fused_qkv) == "fused projections"
    windowed = dataclasses.replace(cfg, window_layers=(0,))
    assert unsupported_reason(
        windowed, layers, torch.bfloat16, torch.device("cpu"), F.silu, rms_norm
    )


def test_batch_invariant_kernels_keep_the_layer_by_layer_forward(local: LocalModel) -> None:
    model = LlamaModel(local.config, local.weights)
    invariant = KernelLoader(batch_invariant=True)
    assert invariant.native_available()
    assert model._fused_decode_for(invariant) is None


def test_the_log_says_why_a_model_runs_layer_by_layer(
    local: LocalModel, caplog: pytest.LogCaptureFixture
) -> None:
    """--attention-backend reference disables the kernels: said once, at INFO, not as a fault."""
    model = LlamaModel(local.config, local.weights)
    with caplog.at_level("INFO"):
        assert model._fused_decode_for(KernelLoader(enabled=False)) is None
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("INFO", "decode steps run layer by layer (no native kernels: disabled)") in messages
    assert not [m for level, m in messages if level == "WARNING"]


def test_the_thread_choice_follows_the_faster_count_and_keeps_trying_the_other() -> None:
    choice = ThreadChoice(all_threads=2, explore_every=4)
    assert choice.next() == 2
    choice.record(2, 0.010)
    assert choice.next() == 1
    choice.record(1, 0.020)
    # quiet: two threads are faster; one is tried every 4th step
    picks = []
    for _ in range(8):
        count = choice.next()
        picks.append(count)
        choice.record(count, 0.010 if count == 2 else 0.020)
    assert picks == [2, 2, 2, 1, 2, 2, 2, 1]
    # a busy neighbour: two threads slow down to 30 ms, one stays at 20 ms; the choice moves
    for _ in range(40):
        count = choice.next()
        choice.record(count, 0.030 if count == 2 else 0.020)
    assert choice.next() == 1 and choice.mean_s[2] > choice.mean_s[1]
    assert ThreadChoice(all_threads=1).next() == 1


def test_a_fused_step_with_one_thread_equals_one_with_all(
    native: KernelLoader, local: LocalModel
) -> None:
    model = LlamaModel(local.config, local.weights)
    caches = prefilled(model, native, [[1, 2, 3, 4, 5, 6]], [[7, 2]])
    fused = model._fused_decode_for(native)
    assert fused is not None
    meta = metadata([7], [[7, 2]], [1])
    h = torch.randn(1, PRESET.hidden_size).to(torch.bfloat16)
    cos, sin = model.rotary.tables(torch.tensor([6]), torch.bfloat16)
    step = fused._step
    lists = ([k for k, _ in caches], [v for _, v in caches])
    args = (*lists, meta.slot_mapping, meta.block_tables, meta.seq_lens, cos, sin)
    assert torch.equal(step.forward(h, *args, 1), step.forward(h, *args, 0))
    with pytest.raises(RuntimeError, match="num_threads"):
        step.forward(h, *args, -1)


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_rows_taken_by_other_threads_give_the_same_step(
    native: KernelLoader, model_dirs: dict[str, Path], weights: str
) -> None:
    # More threads than this machine's cores: threads that have not started yet have their rows
    # taken by those that run (the projection phases' work stealing), in a different way each
    # time. Every row must be computed once and the step equal the one-thread step bit for bit.
    local = LocalModel.load(model_dirs[weights])
    model = LlamaModel(local.config, local.weights)
    caches = prefilled(model, native, [[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5]], [[7, 2], [3, 11]])
    fused = model._fused_decode_for(native)
    assert fused is not None
    meta = metadata([7, 6], [[7, 2], [3, 11]], [1, 1])
    # NOTE: a new input each time, so that a row no thread computed cannot hold the right value
    # left in a reused buffer by the previous call.
    inputs = [torch.randn(2, PRESET.hidden_size).to(torch.bfloat16) for _ in range(30)]
    cos, sin = model.rotary.tables(torch.tensor([6, 5]), torch.bfloat16)
    lists = ([k for k, _ in caches], [v for _, v in caches])
    args = (*lists, meta.slot_mapping, meta.block_tables, meta.seq_lens, cos, sin)
    expected = [fused._step.forward(h, *args, 1) for h in inputs]
    threads = torch.get_num_threads()
    torch.set_num_threads(3 * (os.cpu_count() or 1))
    try:
        for h, want in zip(inputs, expected, strict=True):
            assert torch.equal(fused._step.forward(h, *args, 0), want)
    finally:
        torch.set_num_threads(threads)
