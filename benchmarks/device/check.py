"""The GPU device check's measurements (scripts/device_check.sh), phase by phase, into one report.

On the dummy ``1b`` preset (TinyLlama's 1.1B shape, bf16), with loader, kvstore and scheduler on
``--device``, the phases are:

- ``model``: the checkpoint written (or found in the cache), its weight bytes per token;
- ``bandwidth``: device-to-device copy rate (bytes read + written per second, the HBM rate a
  decode step can reach) and the batch-1 decode bound = that rate / weight bytes per token;
- ``serving``: the stack's start-up, where attention runs and how many decode CUDA graphs the
  scheduler captured, the weights' handle kind;
- ``batch1``: batch-1 decode tok/s through the four services, and its ratio to the bound;
- ``throughput``: output tok/s of ``--requests`` concurrent requests;
- ``memory``: device memory per layer process (NVML) and the device's total used;
- ``loader_kill``: greedy ids with the loader killed (SIGKILL) mid-generation, and after its
  restart, equal to an undisturbed run (requests one at a time, a cache salt per run, so the runs
  compute identical steps); then ``memory_after_loader_restart``;
- ``hf``: transformers' padded static batch of the same requests on the same device.

The run is bounded and leaves its results on the way: ``--budget-s`` bounds it all (the stack's
start-up, every RPC deadline and wait take at most what is left; a phase that finds nothing left
ends the run with ``error``), the report is written to ``--report`` after every phase (atomically),
and SIGTERM (the step's ``timeout``) ends the run through the normal path, stopping the stack, with
``interrupted`` set. On CUDA, figures measured on the pure-torch attention path or without decode
CUDA graphs are not the real path's: ``problems`` says so. ``ok`` is true when every phase ran and
no problem was found; the exit code is 0 only then. With ``--device cpu --preset tiny`` the same
code runs on a CPU machine (the script's ``--dry-run``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import grpc
import torch

from benchmarks.device.measure import (
    KILL_PROMPTS,
    copy_bandwidth,
    greedy_tokens,
    loader_kill,
    process_memory,
    serving,
)
from benchmarks.device.report import Budget, BudgetExhausted, Interrupted, Report, sigterm_held
from benchmarks.hf.generate import hf_generate_batch, load_hf
from zerolayer.bench.roofline import weight_traffic
from zerolayer.bench.streams import (
    decode_tok_s,
    generate_request,
    random_prompts,
    stream_token_times,
)
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.common.setting import parse_bytes
from zerolayer.common.settings import MAX_NUM_SEQS
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import generation_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="1b")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--port", type=int, default=50777)
    p.add_argument("--kv-cache-bytes", type=parse_bytes, default=4 << 30)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--budget-s", type=float, default=600.0, help="bound of the whole run")
    p.add_argument("--report", default="", help="JSON file rewritten after every phase")
    p.add_argument("--log-dir", default="", help="layer logs (default: a new temporary directory)")
    return p


def main(argv: list[str] | None = None) -> dict:
    """Runs the phases; returns the report (also written to ``--report``)."""
    args = build_parser().parse_args(argv)
    report = Report(
        args.report, {"torch": torch.__version__, "device": args.device, "preset": args.preset}
    )
    budget = Budget(args.budget_s)

    def on_sigterm(signum: int, frame: object) -> None:
        raise Interrupted(f"SIGTERM during phase {report.phase_now}")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run_phases(args, budget, report)
    except (Interrupted, BudgetExhausted) as exc:
        report.doc["interrupted" if isinstance(exc, Interrupted) else "error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported in the document, with the traceback
        traceback.print_exc()
        report.doc["error"] = f"{type(exc).__name__} in phase {report.phase_now}: {exc}"
    finally:
        signal.signal(signal.SIGTERM, previous)
        failed = "error" in report.doc or "interrupted" in report.doc
        report.doc["ok"] = not failed and not report.doc["problems"]
        report.write()
    return report.doc


def run_phases(args: argparse.Namespace, budget: Budget, report: Report) -> None:
    device = torch.device(args.device)
    if device.type == "cuda":
        report.doc["gpu"] = torch.cuda.get_device_name(device)
    report.phase_now = "model"
    started = time.perf_counter()
    model_dir = Path(ensure_dummy_model(args.preset))
    per_token = weight_traffic(model_dir)["weight_bytes_per_token"]
    report.phase(
        "model",
        {
            "write_s": time.perf_counter() - started,
            "weight_bytes": sum(t.nbytes for t in read_checkpoint(model_dir).tensors),
            "weight_bytes_per_token": per_token,
        },
    )
    report.phase_now = "bandwidth"
    bandwidth = copy_bandwidth(device, args.copy_bytes)
    bound = bandwidth / per_token
    report.phase("bandwidth", {"copy_bytes_per_s": bandwidth, "batch1_bound_tok_s": bound})
    report.phase_now = "serving"
    address = f"127.0.0.1:{args.port}"
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="zerolayer-device-check-")
    report.doc["logs"] = log_dir
    config = StackConfig(
        model_dir=str(model_dir),
        listen=address,
        device=args.device,
        kv_cache_bytes=args.kv_cache_bytes,
        max_num_seqs=max(MAX_NUM_SEQS.default, args.requests),
        log_dir=log_dir,
        startup_timeout_s=budget.left("serving"),
    )
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(args.requests, args.prompt_tokens, vocab_size, seed=3)
    started = time.perf_counter()
    stack = Stack(config)
    stack.start()
    try:
        report.phase("serving", serving(stack, device, time.perf_counter() - started))
        check_serving(report, device)
        run_stack_phases(args, stack, prompts, bound, budget, report)
    finally:
        with sigterm_held():
            stack.stop()
    if not args.skip_hf:
        report.phase_now = "hf"
        model = load_hf(model_dir, args.device)
        hf_generate_batch(model, [q[:8] for q in prompts[:2]], 2)
        budget.left("hf")
        hf_tok_s = (
            args.requests
            * args.max_new_tokens
            / hf_generate_batch(model, prompts, args.max_new_tokens)
        )
        zerolayer = report.doc["throughput"]["zerolayer_tok_s"]
        hf = {"padded_batch_tok_s": hf_tok_s, "zerolayer_vs_hf": zerolayer / hf_tok_s}
        report.phase("hf", hf)


def check_serving(report: Report, device: torch.device) -> None:
    """On CUDA, figures off the Triton path or without decode graphs are not the real path's."""
    if device.type != "cuda":
        return
    serving_info = report.doc["serving"]
    if serving_info["attention_backend"] != "triton":
        report.problem(
            f"attention ran on {serving_info['attention_backend']!r}, not Triton: the figures "
            "below are not the serving path's"
        )
    if serving_info["num_cuda_graphs"] == 0:
        report.problem("no decode CUDA graph was captured: decode figures are eager steps'")


def run_stack_phases(
    args: argparse.Namespace,
    stack: Stack,
    prompts: list[list[int]],
    bound: float,
    budget: Budget,
    report: Report,
) -> None:
    address = stack.config.listen
    report.phase_now = "batch1"
    greedy_tokens(address, prompts[:2], 4, budget.left("batch1"))  # warm-up
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TextGenerationStub(channel)
        request = generate_request(prompts[0], args.max_new_tokens)
        single = stream_token_times(stub, request, timeout_s=budget.left("batch1"))
    batch1 = decode_tok_s([single])
    report.phase("batch1", {"decode_tok_s": batch1, "vs_bandwidth_bound": batch1 / bound})
    report.phase_now = "throughput"
    started = time.perf_counter()
    greedy_tokens(address, prompts, args.max_new_tokens, budget.left("throughput"))
    zl_tok_s = args.requests * args.max_new_tokens / (time.perf_counter() - started)
    report.phase("throughput", {"requests": args.requests, "zerolayer_tok_s": zl_tok_s})
    device = torch.device(args.device)
    if device.type == "cuda":
        report.phase_now = "memory"
        pids = {layer: proc.pid for layer, proc in stack.processes.items()}
        report.phase("memory", process_memory(pids, device.index or 0))
    report.phase_now = "loader_kill"
    kill = loader_kill(stack, prompts[:KILL_PROMPTS], args.max_new_tokens, budget)
    report.phase("loader_kill", kill)
    for key in ("identical_tokens_during_kill", "identical_tokens_after_restart"):
        if not kill[key]:
            report.problem(f"loader_kill: {key} is false")
    if device.type == "cuda":
        report.phase_now = "memory_after_loader_restart"
        pids = {layer: proc.pid for layer, proc in stack.processes.items()}
        report.phase("memory_after_loader_restart", process_memory(pids, device.index or 0))


if __name__ == "__main__":
    document = main(sys.argv[1:])
    json.dump(document, sys.stdout, indent=2, default=str)
    print()
    sys.exit(0 if document["ok"] else 1)
