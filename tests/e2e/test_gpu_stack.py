"""The four layers on a GPU (``--device cuda:0``): weights and KV arena in exportable device memory
owned by the loader and the kvstore, imported by the scheduler. Run by scripts/device_check.sh.

One stack serves every test of this module, in order:

- its greedy ids equal those of the in-process engine on the same GPU (the same bf16 Triton
  kernels and CUDA graphs), with attention on Triton and graphs captured;
- the loader holds the one device copy of the weights;
- kill -9 of the loader mid-generation, then of the kvstore, changes no token (VMM memory outlives
  its exporter while the scheduler maps it; the launcher's fd keeper hands it to the successor).

References are GPU runs, never the CPU stack: the Triton kernel rounds the softmax probabilities
to bf16 before P.V and the CPU kernel keeps float32, so over many greedy tokens a near tie may
flip without a bug (cross-device parity is checked in float32 by tests/scheduler/
test_cuda_forward.py). Requests go one at a time, each run under its own cache salt, so every run
computes the same steps with the same shapes: ids are then equal bit for bit, not up to rounding.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e.stack import generate_ids, running_stack, scheduler_stats, text_stub
from factories import generate
from scheduler.model.test_cuda_forward import engine_on

from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import PRESETS, write_dummy_model
from zerolayer.common.clients import fetch_manifest
from zerolayer.sharing.manifest import HandleKind
from zerolayer.stack.launcher import Stack

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

PROMPTS = [[3 + (i * 7 + j) % 200 for j in range(20 + 9 * i)] for i in range(4)]
MAX_NEW_TOKENS = 24  # test_cuda_forward.generate's


def greedy(stack: Stack, salt: str) -> list[list[int]]:
    """Greedy ids of each prompt, one request at a time, under cache salt ``salt``."""
    stub = text_stub(stack)
    return [list(generate_ids(stub, p, MAX_NEW_TOKENS, salt).token_ids) for p in PROMPTS]


def wait_for_new_pid(stack: Stack, layer: str, pid: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while stack.processes[layer].pid == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stack.processes[layer].pid != pid, f"the {layer} was not restarted"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dummy_model(tmp_path_factory.mktemp("gpu-model"), PRESETS["small"], seed=11)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-stack-logs")


@pytest.fixture(scope="module")
def stack(model_dir: Path, log_dir: Path) -> Iterator[Stack]:
    with running_stack(model_dir, log_dir, device="cuda:0", kv_cache_bytes=256 << 20) as stack:
        yield stack


@pytest.fixture(scope="module")
def reference(stack: Stack) -> list[list[int]]:
    """The stack's own ids, undisturbed."""
    return greedy(stack, "reference")


def test_the_gpu_stack_gives_the_in_process_gpu_engines_greedy_ids(
    stack: Stack, reference: list[list[int]], model_dir: Path
) -> None:
    config = stack.config
    engine = engine_on(
        model_dir,
        "cuda:0",
        graph_sizes=None,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
    )
    engine.capture_graphs()
    in_process = [generate(engine, [p], tag=f"p{i}-")[0] for i, p in enumerate(PROMPTS)]
    assert [len(ids) for ids in reference] == [MAX_NEW_TOKENS] * len(PROMPTS)
    assert reference == in_process
    stats = scheduler_stats(stack)
    assert stats.attention_backend == "triton"
    assert stats.num_cuda_graphs == engine.runner.num_cuda_graphs > 0


def test_the_loader_holds_the_one_device_copy_of_the_weights(stack: Stack, model_dir: Path) -> None:
    weight_bytes = sum(t.nbytes for t in read_checkpoint(model_dir).tensors)
    manifest = fetch_manifest(
        stack.address("loader"), accepted=(HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC)
    )
    assert manifest.device_memory is not None
    assert manifest.device_memory.size_bytes >= weight_bytes
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()
    pids = {layer: process.pid for layer, process in stack.processes.items()}
    if not set(pids.values()) & set(used):
        # NOTE: NVML in a VM or another PID namespace may list no process of ours (or none).
        warnings.warn(f"NVML reports no per-process memory of the stack here: {used}", stacklevel=1)
        return
    # NVML charges memory to the process that created it: the loader owns the weights. (The
    # scheduler's share is reported by scripts/device_check.sh; contexts and activations make a
    # per-process inequality here unreliable.)
    assert (used.get(pids["loader"]) or 0) >= manifest.device_memory.size_bytes


def test_killing_the_loader_mid_generation_changes_no_token(
    stack: Stack, reference: list[list[int]], log_dir: Path
) -> None:
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(tokens=greedy(stack, "loader-kill")))
    pid = stack.processes["loader"].pid
    thread.start()
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert result["tokens"] == reference
    wait_for_new_pid(stack, "loader", pid)
    # Still serving, with the same tokens, after the loader came back; the new loader mapped
    # the copy the launcher's fd keeper held instead of making a second one.
    try:
        assert greedy(stack, "after-loader-restart") == reference
    except grpc.RpcError as exc:  # pragma: no cover - reported with the code
        pytest.fail(f"after the loader restart: {exc.code()}: {exc.details()}")
    log = log_dir / "loader.log"
    deadline = time.monotonic() + 30
    while "reusing the device copy" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "reusing the device copy" in log.read_text()


def test_killing_the_kvstore_keeps_the_gpu_arena(
    stack: Stack, reference: list[list[int]], log_dir: Path
) -> None:
    pid = stack.processes["kvstore"].pid
    os.kill(pid, signal.SIGKILL)
    wait_for_new_pid(stack, "kvstore", pid)
    deadline = time.monotonic() + 60
    attempt = 0
    while True:
        attempt += 1
        try:
            assert greedy(stack, f"after-kvstore-restart-{attempt}") == reference
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert "reopened" in (log_dir / "kvstore.log").read_text()
