"""The Triton paged-attention kernel (zerolayer/scheduler/model/triton_attention.py) against the
pure-torch reference.

Without a GPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors:
the same program, executed block by block in numpy, so these tests check its indexing, masking and
online softmax in CI. Tests marked ``gpu`` compile it for CUDA and also capture a decode step in a
CUDA graph. Each step mixes decodes, fresh prefills and chunks on a cached prefix, with block
tables drawn from a shuffled pool and caches full of finite garbage outside the sequences.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import make_request

from zerolayer.scheduler.core.scheduler_output import ScheduledRequest, SchedulerOutput
from zerolayer.scheduler.model import triton_attention
from zerolayer.scheduler.model.attention import (
    AttentionMetadata,
    paged_attention,
    paged_attention_reference,
    write_kv,
)
from zerolayer.scheduler.model.model_runner import build_metadata
from zerolayer.scheduler.model.triton_attention import (
    launch_config,
    paged_attention_triton,
    triton_available,
)

SPARE_BLOCKS = 8
"""Blocks of every cache that no sequence owns (garbage the kernel must not read)."""

# (num_cached_tokens, num_new_tokens) of each sequence of a step.
STEPS = {
    "decode": [(7, 1), (12, 1), (3, 1), (40, 1), (0, 1), (15, 1)],
    "prefill": [(0, 9), (0, 40), (0, 16)],
    "mixed": [(7, 1), (0, 9), (12, 1), (5, 6), (3, 1), (8, 4), (1, 2), (33, 20)],
    # Chunks starting mid-block (for block sizes 4 and 16) after a cached prefix.
    "chunk_mid_block": [(5, 6), (13, 30), (18, 3), (1, 1)],
    # Contexts of several 64-key tiles, prefills of several query tiles.
    "long": [(150, 1), (70, 80), (0, 33)],
}
FLOAT32_TOL = {"atol": 1e-5, "rtol": 1e-5}
# Low-precision output against a float32 reference on the same (low-precision-valued) inputs: the
# probabilities enter the second dot rounded to the input dtype (2**-9 relative for bfloat16, so
# up to 2**-9 * max|v| absolute), and the output is rounded to it (half an ulp, 2**-9 relative).
BFLOAT16_TOL = {"atol": 1e-2, "rtol": 2**-8}
FLOAT16_TOL = {"atol": 2e-3, "rtol": 2**-10}
TOL = {torch.float32: FLOAT32_TOL, torch.bfloat16: BFLOAT16_TOL, torch.float16: FLOAT16_TOL}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@dataclasses.dataclass
class Step:
    """A step whose K/V is already in the (CPU) caches."""

    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    spare_block_ids: list[int]
    scale: float


def make_step(
    step: list[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    num_blocks: int = 0,
) -> Step:
    """Random K/V written through the slot mapping, block ids from a shuffled pool of at least
    ``num_blocks`` blocks."""
    g = torch.Generator().manual_seed(seed)
    used = [-(-(cached + new) // block_size) for cached, new in step]
    num_blocks = max(num_blocks, sum(used) + SPARE_BLOCKS)
    free = torch.randperm(num_blocks, generator=g).tolist()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = (100 * torch.randn(shape, generator=g)).to(dtype)
    v_cache = (100 * torch.randn(shape, generator=g)).to(dtype)
    queries, scheduled = [], []
    for i, ((num_cached, num_new), num_used) in enumerate(zip(step, used, strict=True)):
        length = num_cached + num_new
        block_ids, free = free[:num_used], free[num_used:]
        k, v = (torch.randn(length, num_kv_heads, head_dim, generator=g) for _ in range(2))
        slots = torch.tensor(
            [block_ids[p // block_size] * block_size + p % block_size for p in range(length)]
        )
        write_kv(k_cache, v_cache, k.to(dtype), v.to(dtype), slots)
        queries.append(torch.randn(num_new, num_q_heads, head_dim, generator=g).to(dtype))
        request = make_request(str(i), range(3, 3 + length), block_ids)
        scheduled.append(ScheduledRequest(request, num_cached, num_new, samples=True))
    _, _, meta, _ = build_metadata(SchedulerOutput(scheduled), block_size)
    return Step(torch.cat(queries), k_cache, v_cache, meta, free, head_dim**-0.5)


def run_triton(
    step: Step, device: str = "cpu", max_query_len: int | None = None, **overrides: torch.Tensor
) -> torch.Tensor:
    """The kernel on ``step`` (moved to ``device``); the result on the CPU."""
    index = {
        "query_start_loc": step.meta.query_start_loc,
        "seq_lens": step.meta.seq_lens,
        "block_tables": step.meta.block_tables,
        **overrides,
    }
    out = paged_attention_triton(
        step.q.to(device),
        step.k_cache.to(device),
        step.v_cache.to(device),
        **{name: tensor.to(device) for name, tensor in index.items()},
        scale=step.scale,
        max_query_len=max_query_len or step.meta.max_query_len,
    )
    return out.cpu()


def float32_reference(step: Step) -> torch.Tensor:
    """The pure-torch path on float32 copies of the step's inputs."""
    return paged_attention_reference(
        step.q.float(), step.k_cache.float(), step.v_cache.float(), step.meta, step.scale
    )


def assert_matches_reference(out: torch.Tensor, step: Step) -> None:
    assert out.shape == step.q.shape and out.dtype == step.q.dtype
    torch.testing.assert_close(out.float(), float32_reference(step), **TOL[step.q.dtype])


@pytest.fixture
def interpreter() -> None:
    """The interpreter cases run only in the process test_interpreter_cases_in_their_own_process
    starts with ``TRITON_INTERPRET=1``: Triton reads it when ``triton.language`` is imported (its
    own jit helpers, ``tl.zeros`` and the like, are decorated then), so it cannot be switched on
    inside a process that may already have imported Triton. tests/conftest.py deselects them
    elsewhere."""
    assert os.environ.get("TRITON_INTERPRET") == "1"


def test_interpreter_cases_in_their_own_process() -> None:
    pytest.importorskip("triton", reason="triton wheels exist for Linux only")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "triton_interpreter"]
        + ["-p", "no:xdist"]  # in this one process, never on workers
        + [str(Path(__file__))],
        cwd=Path(__file__).resolve().parents[3],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, summary


# --- Triton's interpreter on the CPU (CI) ---


@pytest.mark.triton_interpreter
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(2, 2), (12, 4)])  # MHA, GQA
@pytest.mark.parametrize("step_name", list(STEPS))
def test_interpreter_float32_matches_reference(
    interpreter: None, step_name: str, num_q_heads: int, num_kv_heads: int
) -> None:
    step = make_step(STEPS[step_name], num_q_heads, num_kv_heads, 32, seed=len(step_name))
    assert_matches_reference(run_triton(step), step)


@pytest.mark.triton_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(2, 2), (8, 2)])
def test_interpreter_half_precision_matches_float32_reference(
    interpreter: None, num_q_heads: int, num_kv_heads: int, dtype: torch.dtype
) -> None:
    step = make_step(STEPS["mixed"], num_q_heads, num_kv_heads, 64, dtype=dtype, seed=1)
    assert_matches_reference(run_triton(step), step)


@pytest.mark.triton_interpreter
@pytest.mark.parametrize("head_dim", [8, 40])
def test_interpreter_head_dims_below_and_between_powers_of_two(
    interpreter: None, head_dim: int
) -> None:
    step = make_step(STEPS["chunk_mid_block"], 4, 2, head_dim, block_size=4, seed=2)
    assert_matches_reference(run_triton(step), step)


@pytest.mark.triton_interpreter
@pytest.mark.parametrize("block_size", [1, 4, 32])
def test_interpreter_block_sizes(interpreter: None, block_size: int) -> None:
    step = make_step(STEPS["mixed"], 4, 2, 16, block_size=block_size, seed=3)
    assert_matches_reference(run_triton(step), step)


@pytest.mark.triton_interpreter
def test_interpreter_never_reads_block_table_entries_past_the_sequence(interpreter: None) -> None:
    step = make_step(STEPS["mixed"], 4, 2, 16, block_size=4, seed=4)
    tables = step.meta.block_tables
    used = ((step.meta.seq_lens + 3) // 4).tolist()
    spare = step.spare_block_ids[0]  # a real block full of garbage: reading it changes the result
    padded = torch.full((tables.shape[0], tables.shape[1] + 3), spare, dtype=torch.int64)
    for b, n in enumerate(used):
        padded[b, :n] = tables[b, :n]
    assert torch.equal(run_triton(step, block_tables=padded), run_triton(step))


@pytest.mark.triton_interpreter
def test_interpreter_padded_batch_rows_and_unowned_queries_give_zeros(interpreter: None) -> None:
    """Like a decode batch padded for a CUDA graph: two sequences with no queries, two q rows
    that no sequence owns."""
    step = make_step(STEPS["decode"], 4, 2, 16, seed=5)
    num_tokens, tables = step.q.shape[0], step.meta.block_tables
    padded = dataclasses.replace(step, q=torch.cat([step.q, torch.full((2, 4, 16), 1e4)]))
    out = run_triton(
        padded,
        query_start_loc=torch.cat([step.meta.query_start_loc, torch.tensor([num_tokens] * 2)]),
        seq_lens=torch.cat([step.meta.seq_lens, torch.zeros(2, dtype=torch.int64)]),
        block_tables=torch.cat([tables, torch.zeros(2, tables.shape[1], dtype=torch.int64)]),
    )
    assert torch.equal(out[:num_tokens], run_triton(step))
    assert torch.equal(out[num_tokens:], torch.zeros(2, 4, 16))


@pytest.mark.triton_interpreter
def test_interpreter_int32_metadata_and_a_larger_max_query_len(interpreter: None) -> None:
    step = make_step(STEPS["mixed"], 4, 2, 16, seed=6)
    int32 = {
        "query_start_loc": step.meta.query_start_loc.int(),
        "seq_lens": step.meta.seq_lens.int(),
        "block_tables": step.meta.block_tables.int(),
    }
    expected = run_triton(step)
    assert torch.equal(run_triton(step, **int32), expected)
    assert torch.equal(run_triton(step, max_query_len=100), expected)


@pytest.mark.triton_interpreter
def test_interpreter_reads_strided_views_in_place(interpreter: None) -> None:
    """A layer's slice of the arena (only the innermost dim dense), q split out of a fused qkv."""
    step = make_step(STEPS["mixed"], 4, 2, 16, seed=7)
    num_blocks, block_size = step.k_cache.shape[:2]
    wide_k = torch.randn(num_blocks, block_size, 5, 16)
    wide_v = torch.randn(num_blocks, block_size, 5, 16)
    wide_k[:, :, 1:3] = step.k_cache
    wide_v[:, :, 1:3] = step.v_cache
    qkv = torch.randn(step.q.shape[0], 8, 16)
    qkv[:, :4] = step.q
    strided = dataclasses.replace(
        step, q=qkv[:, :4], k_cache=wide_k[:, :, 1:3], v_cache=wide_v[:, :, 1:3]
    )
    assert not strided.q.is_contiguous() and not strided.k_cache.is_contiguous()
    assert torch.equal(run_triton(strided), run_triton(step))


@pytest.mark.triton_interpreter
def test_interpreter_empty_step(interpreter: None) -> None:
    out = paged_attention_triton(
        torch.empty(0, 4, 16),
        torch.zeros(2, 16, 2, 16),
        torch.zeros(2, 16, 2, 16),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, 0, dtype=torch.int64),
        0.25,
        max_query_len=0,
    )
    assert out.shape == (0, 4, 16)


BAD_INPUTS = {
    "cache_dtype": ({"k_cache": torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16)}, "share a dtype"),
    "heads": ({"q": torch.zeros(3, 3, 16)}, "do not fit"),
    "seq_lens_shape": ({"seq_lens": torch.zeros(2, dtype=torch.int64)}, r"seq_lens \[B\]"),
    "float_index": ({"block_tables": torch.zeros(3, 1)}, "block_tables must be int32 or int64"),
}


@pytest.mark.triton_interpreter
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_interpreter_inconsistent_inputs_raise(interpreter: None, case: str) -> None:
    args = {
        "q": torch.zeros(3, 4, 16),
        "k_cache": torch.zeros(2, 4, 2, 16),
        "v_cache": torch.zeros(2, 4, 2, 16),
        "query_start_loc": torch.tensor([0, 1, 2, 3]),
        "seq_lens": torch.ones(3, dtype=torch.int64),
        "block_tables": torch.zeros(3, 1, dtype=torch.int64),
    }
    overrides, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        paged_attention_triton(**{**args, **overrides}, scale=0.25, max_query_len=1)


# --- Without CUDA or without Triton ---


def test_cpu_tensors_without_the_interpreter_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton", reason="triton wheels exist for Linux only")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    step = make_step(STEPS["decode"], 4, 2, 16)
    with pytest.raises(ValueError, match="runs on CUDA"):
        run_triton(step)


def test_unavailable_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    triton_attention._triton.cache_clear()
    try:
        assert not triton_available()
        with pytest.raises(RuntimeError, match="triton"):
            run_triton(make_step(STEPS["decode"], 4, 2, 16))
    finally:
        triton_attention._triton.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_unavailable_without_cuda() -> None:
    assert not triton_available()


def test_importing_attention_does_not_import_triton() -> None:
    code = (
        "import sys, zerolayer.scheduler.model.attention, "
        "zerolayer.scheduler.model.triton_attention; "
        "print('triton' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert result.stdout.strip() == "False"


def test_launch_config() -> None:
    decode = launch_config(group=4, head_dim=128, max_query_len=1, element_size=2)
    assert decode == {
        "GROUP": 4,
        "GROUP_PAD": 4,
        "BLOCK_Q": 1,
        "BLOCK_M": 16,
        "BLOCK_D": 128,
        "BLOCK_N": 64,
    }
    prefill = launch_config(group=3, head_dim=80, max_query_len=300, element_size=4)
    assert prefill == {
        "GROUP": 3,
        "GROUP_PAD": 4,
        "BLOCK_Q": 16,
        "BLOCK_M": 64,
        "BLOCK_D": 128,
        "BLOCK_N": 32,
    }
    small = launch_config(group=1, head_dim=8, max_query_len=3, element_size=4)
    assert (small["BLOCK_Q"], small["BLOCK_M"], small["BLOCK_D"], small["BLOCK_N"]) == (
        4,
        16,
        16,
        64,
    )
    wide = launch_config(group=16, head_dim=256, max_query_len=1, element_size=2)
    assert (wide["BLOCK_M"], wide["BLOCK_N"]) == (16, 32)


def test_max_query_len_of_the_metadata() -> None:
    assert make_step(STEPS["decode"], 2, 2, 16).meta.max_query_len == 1
    assert make_step(STEPS["mixed"], 2, 2, 16).meta.max_query_len == 20


# --- CUDA ---

STEPS_ON_CUDA = ("decode", "mixed", "long")
GPU_HEADS = [(8, 8), (8, 4), (16, 4)]  # GQA ratios 1, 2, 4
# NOTE: each distinct set of tile sizes, dtype and head dim is one Triton compile (about a second
# or two), and the device check has minutes for everything: bfloat16, the serving dtype, gets
# every GQA ratio and step kind at head dim 128; head dim 64 and float32 get two cases each. The
# interpreter cases above cover the wider matrix in CI.
CUDA_CASES = [
    *[(step, hq, hkv, 128, torch.bfloat16) for step in STEPS_ON_CUDA for hq, hkv in GPU_HEADS],
    ("mixed", 8, 4, 64, torch.bfloat16),
    ("long", 16, 4, 64, torch.bfloat16),
    ("decode", 8, 4, 64, torch.float32),
    ("long", 8, 4, 64, torch.float32),
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("step_name", "num_q_heads", "num_kv_heads", "head_dim", "dtype"), CUDA_CASES
)
def test_cuda_matches_reference(
    step_name: str, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    for seed in (0, 1):  # two shuffles of the block pool
        step = make_step(
            STEPS[step_name], num_q_heads, num_kv_heads, head_dim, dtype=dtype, seed=seed
        )
        assert_matches_reference(run_triton(step, "cuda"), step)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("block_size", "dtype"), [(1, torch.bfloat16), (4, torch.float16), (32, torch.bfloat16)]
)
def test_cuda_block_sizes_and_float16(block_size: int, dtype: torch.dtype) -> None:
    step = make_step(
        STEPS["chunk_mid_block"], 12, 4, 128, block_size=block_size, dtype=dtype, seed=8
    )
    assert_matches_reference(run_triton(step, "cuda"), step)


@pytest.mark.gpu
@needs_cuda
def test_cuda_paged_attention_dispatches_to_triton() -> None:
    step = make_step(STEPS["mixed"], 8, 2, 64, dtype=torch.bfloat16, seed=9)
    meta = dataclasses.replace(
        step.meta,
        query_start_loc=step.meta.query_start_loc.cuda(),
        seq_lens=step.meta.seq_lens.cuda(),
        block_tables=step.meta.block_tables.cuda(),
    )
    q, k_cache, v_cache = step.q.cuda(), step.k_cache.cuda(), step.v_cache.cuda()
    out = paged_attention(q, k_cache, v_cache, meta, step.scale)
    assert torch.equal(out.cpu(), run_triton(step, "cuda"))


def copy_decode_step_into(static: dict[str, torch.Tensor], step: Step) -> None:
    """Writes ``step`` (one query per sequence) into the captured tensors in place; batch rows
    past its sequences become padding (no queries, seq_len 0)."""
    num_seqs, width = step.meta.block_tables.shape
    static["q"].zero_()
    static["q"][:num_seqs] = step.q
    static["k_cache"].copy_(step.k_cache)
    static["v_cache"].copy_(step.v_cache)
    static["query_start_loc"].fill_(num_seqs)
    static["query_start_loc"][: num_seqs + 1] = step.meta.query_start_loc
    static["seq_lens"].zero_()
    static["seq_lens"][:num_seqs] = step.meta.seq_lens
    static["block_tables"].zero_()
    static["block_tables"][:num_seqs, :width] = step.meta.block_tables


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_follows_metadata_rewritten_in_place() -> None:
    shape = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "num_blocks": 64}
    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    first = make_step([(7, 1), (30, 1), (0, 1), (15, 1)], **shape, dtype=bf16["dtype"], seed=20)
    second = make_step([(40, 1), (3, 1), (99, 1)], **shape, dtype=bf16["dtype"], seed=21)
    static = {
        "q": torch.zeros(4, 8, 128, **bf16),
        "k_cache": torch.zeros(first.k_cache.shape, **bf16),
        "v_cache": torch.zeros(first.v_cache.shape, **bf16),
        "query_start_loc": torch.zeros(5, dtype=torch.int64, device="cuda"),
        "seq_lens": torch.zeros(4, dtype=torch.int64, device="cuda"),
        "block_tables": torch.zeros(4, 8, dtype=torch.int64, device="cuda"),
    }
    copy_decode_step_into(static, first)

    def attend() -> torch.Tensor:
        return paged_attention_triton(**static, scale=first.scale, max_query_len=1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attend()  # compiles the kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend()

    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(out.cpu(), first)
    copy_decode_step_into(static, second)  # longer contexts, other blocks, one padded row
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(out[:3].cpu(), second)
    assert torch.equal(out[3].cpu(), torch.zeros(8, 128, dtype=torch.bfloat16))
