"""The GPU device check's measurements (scripts/device_check.sh); prints one JSON document.

On the dummy ``1b`` preset (TinyLlama's 1.1B shape, bf16), with loader, kvstore and scheduler on
``--device``:

- ``bandwidth``: device-to-device copy rate (bytes read + written per second, the HBM rate a
  decode step can reach) and the batch-1 decode bound = that rate / weight bytes per token;
- ``batch1``: zerolayer's batch-1 decode tok/s through the four services, and its ratio to the
  bound;
- ``throughput``: output tok/s of ``--requests`` concurrent requests, against transformers'
  padded static batch of the same requests on the same GPU, in this run;
- ``memory``: device memory per process (NVML) and the weight bytes: one copy means the
  scheduler's share is far below the weights;
- ``loader_kill``: tokens of 8 greedy streams with the loader killed (SIGKILL) mid-generation
  equal the tokens of an undisturbed run;
- ``nvml``: the NVML self-check of the scheduler's GPU monitoring, when available.

With ``--device cpu --preset tiny`` the same code runs on a CPU machine (CI's smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import torch

from zerolayer.bench.hf_baseline import hf_generate_batch, load_hf
from zerolayer.bench.roofline import weight_traffic
from zerolayer.bench.streams import decode_tok_s, generate_request, random_prompts, run_streams
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import generation_pb2_grpc


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
    """Device memory per layer process (NVML), and the device's total used; {} without NVML."""
    try:
        import pynvml
    except ImportError:
        return {"note": "pynvml (nvidia-ml-py) not installed"}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        used = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "per_process_bytes": {layer: used.get(pid) for layer, pid in pids.items()},
            "device_used_bytes": info.used,
            "note": "NVML charges VMM memory to the process that created it (cuMemCreate)",
        }
    finally:
        pynvml.nvmlShutdown()


def greedy_tokens(address: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Unary greedy Generate of each prompt, all at once; their token ids."""
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        futures = [
            stub.Generate.future(generate_request(p, max_new_tokens), timeout=600) for p in prompts
        ]
        return [list(f.result().token_ids) for f in futures]


def loader_kill(stack: Stack, address: str, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Reference tokens, then the same requests with the loader SIGKILLed after 0.2 s."""
    reference = greedy_tokens(address, prompts, max_new_tokens)
    result: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: result.update(tokens=greedy_tokens(address, prompts, max_new_tokens))
    )
    pid = stack.processes["loader"].pid
    thread.start()
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    thread.join()
    deadline = time.monotonic() + 120
    while stack.processes["loader"].pid == pid and time.monotonic() < deadline:
        time.sleep(0.1)  # the supervisor restarts it
    after_restart = greedy_tokens(address, prompts[:1], max_new_tokens)
    return {
        "killed_pid": pid,
        "restarted_pid": stack.processes["loader"].pid,
        "identical_tokens_during_kill": result.get("tokens") == reference,
        "identical_tokens_after_restart": after_restart == reference[:1],
    }


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="1b")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--port", type=int, default=50777)
    p.add_argument("--kv-cache-bytes", type=int, default=4 << 30)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--log-dir", default="", help="layer logs (default: a new temporary directory)")
    args = p.parse_args(argv)
    report: dict = {"torch": torch.__version__, "device": args.device, "preset": args.preset}
    device = torch.device(args.device)
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    model_dir, gen_s = timed(lambda: ensure_dummy_model(args.preset))
    report["model_write_s"] = gen_s
    model_dir = Path(model_dir)  # type: ignore[arg-type]
    weight_bytes = sum(t.nbytes for t in read_checkpoint(model_dir).tensors)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    per_token = weight_traffic(model_dir)["weight_bytes_per_token"]
    bandwidth = copy_bandwidth(device, args.copy_bytes)
    bound = bandwidth / per_token
    report["bandwidth"] = {
        "copy_bytes_per_s": bandwidth,
        "weight_bytes": weight_bytes,
        "weight_bytes_per_token": per_token,
        "batch1_bound_tok_s": bound,
    }
    address = f"127.0.0.1:{args.port}"
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="zerolayer-device-check-")
    config = StackConfig(
        model_dir=str(model_dir),
        listen=address,
        device=args.device,
        kv_cache_bytes=args.kv_cache_bytes,
        max_num_seqs=max(64, args.requests),
        log_dir=log_dir,
        startup_timeout_s=600,
    )
    report["logs"] = log_dir
    with Stack(config) as stack:
        prompts = random_prompts(args.requests, args.prompt_tokens, vocab_size, seed=3)
        greedy_tokens(address, prompts[:2], 4)  # warm-up
        single = run_streams(address, [generate_request(prompts[0], args.max_new_tokens)], [0.0])
        batch1 = decode_tok_s(single)
        report["batch1"] = {"decode_tok_s": batch1, "vs_bandwidth_bound": batch1 / bound}
        _, seconds = timed(lambda: greedy_tokens(address, prompts, args.max_new_tokens))
        zl_tok_s = args.requests * args.max_new_tokens / seconds
        report["throughput"] = {"requests": args.requests, "zerolayer_tok_s": zl_tok_s}
        pids = {layer: proc.pid for layer, proc in stack.processes.items()}
        if device.type == "cuda":
            report["memory"] = process_memory(pids, device.index or 0)
        report["loader_kill"] = loader_kill(stack, address, prompts[:8], args.max_new_tokens)
        if device.type == "cuda":
            report["memory_after_loader_restart"] = process_memory(
                {layer: proc.pid for layer, proc in stack.processes.items()}, device.index or 0
            )
    if not args.skip_hf:
        model = load_hf(model_dir, args.device)
        hf_generate_batch(model, [q[:8] for q in prompts[:2]], 2)
        hf_s = hf_generate_batch(model, prompts, args.max_new_tokens)
        hf_tok_s = args.requests * args.max_new_tokens / hf_s
        report["throughput"].update(hf_padded_batch_tok_s=hf_tok_s, vs_hf=zl_tok_s / hf_tok_s)
        del model
    try:
        from zerolayer.scheduler.gpu_health.nvml_check import nvml_self_check

        report["nvml"] = nvml_self_check(device.index or 0) if device.type == "cuda" else None
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        report["nvml"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["targets"] = {
        "batch1_vs_bandwidth_bound": ">= 0.7",
        "throughput_vs_hf": ">= 3",
        "one_copy_of_weights": "scheduler's device memory << weight bytes",
    }
    return report


if __name__ == "__main__":
    json.dump(main(sys.argv[1:]), sys.stdout, indent=2, default=str)
    print()
