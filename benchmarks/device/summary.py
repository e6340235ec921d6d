"""The device check's summary (scripts/device_check.sh): ``$OUT/summary.json``, rewritten after
every step, and one capped archive of the logs, so that whatever ends the run, what was measured
so far comes back.

The script calls ``python -m benchmarks.device.summary start``, then ``step NAME ...`` after
each of its steps, then ``finish``; each rewrites ``summary.json`` atomically and ``logs.tar.gz``,
the only two files it leaves in ``--out`` (the device tool brings back at most 8). The summary holds
the versions, each step's exit code, seconds and bound, the attention path and CUDA graphs of the
served stack, the test counts (from the junit XML, or from the pytest log when a killed run wrote
none), every figure the bench measured so far, and ``problems``; ``ok`` is true only when every step
passed, no gpu test failed, skipped or was missing, and nothing is in ``problems``. Standard library
only: it runs before the carried wheels are installed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.device.logs import archive_logs, pytest_counts

SUMMARY = "summary.json"
LOGS = "logs.tar.gz"
TIMED_OUT_CODES = (124, 137)
"""Exit codes of a command ``timeout`` ended (SIGTERM, then SIGKILL after the grace)."""
PRINT_LIMIT = 8000
"""Most characters :func:`compact` prints: the device tool returns the last 12,000 of the
output, and the summary must be among them."""
TEST_STEPS = ("gpu_unit", "gpu_stack")


def read(out: Path) -> dict:
    return json.loads((out / SUMMARY).read_text())


def write(out: Path, work: Path, summary: dict) -> None:
    """Rewrites the logs archive, then ``summary.json`` (each a sibling replaced atomically)."""
    summary["logs"] = archive_logs(work, out / LOGS)
    summary["elapsed_s"] = round(time.time() - summary["started_unix_s"], 1)
    summary["problems"] = problems(summary)
    summary["ok"] = not summary["problems"]
    tmp = out / f".{SUMMARY}.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    os.replace(tmp, out / SUMMARY)


def start(out: Path, work: Path, budget_s: int, dry_run: bool, steps: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name in (SUMMARY, LOGS):  # never report an earlier run's results as this one's
        (out / name).unlink(missing_ok=True)
    summary = {
        "dry_run": dry_run,
        "budget_s": budget_s,
        "expected_steps": steps,
        "started_unix_s": time.time(),
        "versions": None,
        "attention": None,
        "num_cuda_graphs": None,
        "tests": None,
        "figures": {},
        "steps": {},
        "problems": [],
    }
    write(out, work, summary)
    return summary


def record_step(summary: dict, name: str, args: argparse.Namespace) -> None:
    """Adds step ``name``'s outcome (and what its output files say) to ``summary``."""
    step: dict = {"exit_code": args.exit_code, "seconds": args.seconds, "bound_s": args.bound_s}
    if args.not_run:
        step.update(status="not_run", reason=args.not_run)
    elif args.exit_code in TIMED_OUT_CODES:
        step["status"] = "timed_out"
    else:
        step["status"] = "passed" if args.exit_code == 0 else "failed"
    if summary["dry_run"] and step["status"] == "failed" and name == "nvml":
        step["status"] = "dry_run"  # no GPU or NVML here: the plumbing ran, which is the point
    document = _load_json(args.json) if args.json else None
    if name == "versions" and document is not None:
        summary["versions"] = document
    elif name == "nvml" and document is not None:
        keep = ("ok", "problems", "notes", "event_types", "wait", "recovery_action", "uuid")
        step["nvml"] = {key: document.get(key) for key in keep}
    elif name == "bench" and document is not None:
        record_bench(summary, step, document)
    if name in TEST_STEPS:
        step["tests"] = pytest_counts(args.junit, args.log, args.collect_only)
        summary["tests"] = _total_tests(summary, name, step["tests"])
    summary["steps"][name] = step


def record_bench(summary: dict, step: dict, report: dict) -> None:
    serving = report.get("serving") or {}
    summary["attention"] = serving.get("attention_backend")
    summary["num_cuda_graphs"] = serving.get("num_cuda_graphs")
    summary["figures"] = {}
    for phase in report.get("phases_done", ()):
        summary["figures"].update(_flatten(report.get(phase) or {}, phase))
    keep = ("ok", "phases_done", "problems", "error", "interrupted", "gpu", "logs")
    step["bench"] = {key: report.get(key) for key in keep if key in report}


def _flatten(values: dict, prefix: str) -> dict:
    """The scalar leaves of ``values`` (nested dicts too) by dotted key; notes left out."""
    flat: dict = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}.{key}"))
        elif isinstance(value, int | float | bool | str | None) and key != "note":
            flat[f"{prefix}.{key}"] = value
    return flat


def problems(summary: dict) -> list[str]:
    """Everything that makes this run not a pass (each step's status included)."""
    found = [
        f"{name}: never ran" for name in summary["expected_steps"] if name not in summary["steps"]
    ]
    for name, step in summary["steps"].items():
        if step["status"] == "not_run":
            found.append(f"{name}: not run ({step['reason']})")
        elif step["status"] not in ("passed", "dry_run"):
            found.append(f"{name}: {step['status']} (exit code {step['exit_code']})")
        tests = step.get("tests") or {}
        if tests and not summary["dry_run"]:
            bad = {k: tests.get(k, 0) for k in ("failed", "errors", "skipped")}
            if any(bad.values()) or not tests.get("passed"):
                found.append(f"{name}: {tests.get('passed', 0)} passed, {bad}")
        for problem in (step.get("bench") or {}).get("problems", ()):
            found.append(f"{name}: {problem}")
        nvml = step.get("nvml") or {}
        if not summary["dry_run"] and nvml.get("problems"):
            found.extend(f"{name}: {problem}" for problem in nvml["problems"])
    versions = summary.get("versions") or {}
    if versions and not summary["dry_run"] and not versions.get("cuda_available"):
        found.append("versions: torch sees no CUDA device")
    return found


def compact(summary: dict) -> str:
    """The summary as one JSON text of at most :data:`PRINT_LIMIT` characters (long lists of
    tests that did not pass are cut first, then the figures)."""
    doc = json.loads(json.dumps(summary, default=str))
    text = json.dumps(doc, indent=1)
    for step in doc["steps"].values():
        if len(text) > PRINT_LIMIT and "tests" in step:
            step["tests"]["not_passed"] = step["tests"].get("not_passed", [])[:5]
            text = json.dumps(doc, indent=1)
    if len(text) > PRINT_LIMIT:
        doc["figures"] = "(see summary.json)"
        text = json.dumps(doc, indent=1)
    return text[:PRINT_LIMIT]


def _total_tests(summary: dict, name: str, counts: dict) -> dict:
    totals = dict(summary.get("tests") or {})
    totals[name] = {k: v for k, v in counts.items() if k != "not_passed"}
    return totals


def _load_json(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device.summary", description=__doc__)
    p.add_argument("command", choices=("start", "step", "finish", "versions"))
    p.add_argument("name", nargs="?", default="", help="the step (command step)")
    p.add_argument("--out", default="", help="the folder that comes back ($OUT)")
    p.add_argument("--work", default="", help="the run's working folder (logs, junit, reports)")
    p.add_argument("--budget-s", type=int, default=420)
    p.add_argument("--steps", default="", help="the steps the run has, comma-separated (start)")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--seconds", type=int, default=0)
    p.add_argument("--bound-s", type=int, default=0)
    p.add_argument("--not-run", default="", help="why the step did not run")
    p.add_argument("--json", default="", help="the step's JSON output (versions, nvml, bench)")
    p.add_argument("--junit", default="", help="pytest's junit XML")
    p.add_argument("--log", default="", help="pytest's output (counts when no junit XML)")
    p.add_argument("--collect-only", action="store_true", help="pytest only collected")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "versions":
        from benchmarks.device.versions import versions

        print(json.dumps(versions(), indent=2))
        return 0
    out, work = Path(args.out), Path(args.work)
    if args.command == "start":
        start(out, work, args.budget_s, args.dry_run, args.steps.split(","))
        return 0
    summary = read(out)
    if args.command == "step":
        record_step(summary, args.name, args)
        write(out, work, summary)
        step = summary["steps"][args.name]
        print(
            f"device check: {args.name} {step['status']} in {step['seconds']} s (bound "
            f"{step['bound_s']} s), {summary['elapsed_s']:.0f} s of {summary['budget_s']} s used",
            *[f"  {p}" for p in summary["problems"] if p.startswith(f"{args.name}: ")],
            sep="\n",
            flush=True,
        )
        return 0
    write(out, work, summary)
    verdict = "passed" if summary["ok"] else "FAILED"
    if summary["dry_run"]:
        verdict = f"dry run {verdict} (the plumbing only: nothing ran on a GPU)"
    print(f"device check {verdict}; summary ({out / SUMMARY}):")
    print(compact(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
