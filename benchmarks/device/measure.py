"""The measurements of the device check's bench (:mod:`benchmarks.device.check`): copy
bandwidth, device memory per process, how the stack serves, and greedy ids around a kill -9 of the
loader. Every deadline comes from the run's :class:`~benchmarks.device.report.Budget`."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import torch

from benchmarks.device.report import Budget, BudgetExhausted
from zerolayer.bench.streams import generate_request
from zerolayer.common.clients import fetch_manifest
from zerolayer.sharing.manifest import HandleKind
from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

KILL_PROMPTS = 4
"""Prompts of the loader-kill runs (one request at a time)."""


def copy_bandwidth(device: torch.device, num_bytes: int, repeats: int = 10) -> float:
    """Bytes moved per second (read + write) by ``Tensor.copy_`` of ``num_bytes`` on ``device``."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    _sync(device)
    seconds = (time.perf_counter() - start) / repeats
    return 2 * num_bytes / seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_memory(pids: dict[str, int], device_index: int) -> dict:
    """Device memory per layer process (NVML), and the device's total used."""
    try:
        import pynvml
    except ImportError:
        return {"note": "pynvml (nvidia-ml-py) not installed"}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        used = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    finally:
        pynvml.nvmlShutdown()
    memory = {
        "per_process_bytes": {layer: used.get(pid) for layer, pid in pids.items()},
        "device_used_bytes": info.used,
        "note": "NVML charges VMM memory to the process that created it (cuMemCreate)",
    }
    if not set(pids.values()) & set(used):
        memory["note"] = f"NVML lists no process of the stack (a VM or PID namespace?): {used}"
    return memory


def greedy_tokens(
    address: str, prompts: list[list[int]], max_new_tokens: int, timeout_s: float
) -> list[list[int]]:
    """Unary greedy Generate of each prompt, all at once; their token ids."""
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        futures = [
            stub.Generate.future(generate_request(p, max_new_tokens), timeout=timeout_s)
            for p in prompts
        ]
        return [list(f.result().token_ids) for f in futures]


def one_at_a_time(
    address: str, prompts: list[list[int]], max_new_tokens: int, salt: str, budget: Budget
) -> list[list[int]]:
    """Greedy ids of each prompt, one request at a time, under cache salt ``salt``."""
    ids = []
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        for prompt in prompts:
            request = generate_request(prompt, max_new_tokens)
            request.cache_salt = salt
            response = stub.Generate(request, timeout=budget.left("loader_kill"))
            ids.append(list(response.token_ids))
    return ids


def loader_kill(
    stack: Stack, prompts: list[list[int]], max_new_tokens: int, budget: Budget
) -> dict:
    """An undisturbed run, then the same with the loader SIGKILLed 0.2 s in, then one after the
    loader's restart; whether their greedy ids are equal."""
    address = stack.config.listen
    reference = one_at_a_time(address, prompts, max_new_tokens, "kill-reference", budget)
    result: dict[str, object] = {}

    def during() -> None:
        try:
            result["tokens"] = one_at_a_time(address, prompts, max_new_tokens, "kill", budget)
        except Exception as exc:  # noqa: BLE001 - reported below
            result["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=during, daemon=True)
    pid = stack.processes["loader"].pid
    thread.start()
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=budget.left("loader_kill"))
    if thread.is_alive():
        raise BudgetExhausted("the budget ran out in phase loader_kill (generation still running)")
    deadline = time.monotonic() + min(120.0, budget.left("loader_kill"))
    while stack.processes["loader"].pid == pid and time.monotonic() < deadline:
        time.sleep(0.1)  # the supervisor restarts it
    after = one_at_a_time(address, prompts[:1], max_new_tokens, "kill-after", budget)
    return {
        "killed_pid": pid,
        "restarted_pid": stack.processes["loader"].pid,
        "error_during_kill": result.get("error"),
        "identical_tokens_during_kill": result.get("tokens") == reference,
        "identical_tokens_after_restart": after == reference[:1],
    }


def serving(stack: Stack, device: torch.device, startup_s: float) -> dict:
    """How the started stack serves: attention path, graphs captured, the weights' handle kind."""
    with grpc.insecure_channel(stack.address("scheduler")) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(
            scheduler_pb2.SchedulerStatsRequest(), timeout=10
        )
    kinds = (HandleKind.CUDA_VMM_FD, HandleKind.CUDA_IPC) if device.type == "cuda" else ()
    manifest = fetch_manifest(stack.address("loader"), accepted=(*kinds, HandleKind.MMAP_FILE))
    return {
        "startup_s": startup_s,
        "attention_backend": stats.attention_backend,
        "num_cuda_graphs": stats.num_cuda_graphs,
        "weights_handle_kind": manifest.handle_kind.name,
    }
