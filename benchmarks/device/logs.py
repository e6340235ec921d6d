"""What the device check keeps of its steps' output: one capped archive of the logs, and the test
counts pytest left (its junit XML, or its verbose log when the step was killed before pytest wrote
the XML)."""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

FILE_CAP_BYTES = 256 << 10
"""Most bytes archived of one file: its end, where the errors are."""
TOTAL_CAP_BYTES = 8 << 20
"""Most bytes archived in all (before compression); files past it are listed as omitted."""
MAX_NOT_PASSED = 30
"""Tests named in ``not_passed`` (the counts stay exact)."""
OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_OUTCOME_LINE = re.compile(
    r"^(?:\[gw\d+\] \[ *\d+%\] (?P<a>[A-Z]+) (?P<ida>\S+::\S+)|(?P<idb>\S+::\S+) (?P<b>[A-Z]+)\b)"
)
"""A verbose (``-v``) result line: ``path::test PASSED`` or, under xdist, ``[gw0] [ 5%] PASSED
path::test``."""


def archive_logs(work: Path, target: Path) -> dict:
    """Writes ``target`` (gzipped tar, replaced atomically) with the last :data:`FILE_CAP_BYTES`
    of every ``*.log`` under ``work`` and of every ``*.out`` (a step's output), ``*.json`` and
    ``*.xml`` directly in it, at most :data:`TOTAL_CAP_BYTES` in all.

    Returns:
        ``files`` archived, ``bytes`` archived, and the files ``cut`` to their end or ``omitted``.
    """
    top = [p for p in work.glob("*") if p.suffix in (".out", ".json", ".xml") and p.is_file()]
    logs = [p for p in work.rglob("*.log") if p.is_file()]
    info: dict = {"files": 0, "bytes": 0, "cut": [], "omitted": []}
    tmp = target.with_name(f".{target.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(set(top + logs), key=lambda p: (len(p.relative_to(work).parts), p)):
            name = str(path.relative_to(work))
            data = _tail(path)
            if data is None:
                continue
            if info["bytes"] + len(data) > TOTAL_CAP_BYTES:
                info["omitted"].append(name)
                continue
            if len(data) < path.stat().st_size:
                info["cut"].append(name)
            member = tarfile.TarInfo(name)
            member.size, member.mtime = len(data), int(time.time())
            tar.addfile(member, io.BytesIO(data))
            info["files"] += 1
            info["bytes"] += len(data)
    os.replace(tmp, target)
    return info


def _tail(path: Path) -> bytes | None:
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - FILE_CAP_BYTES))
            data = f.read(FILE_CAP_BYTES)
    except OSError:
        return None
    if size > FILE_CAP_BYTES:
        data = f"[... the first {size - len(data)} bytes were cut ...]\n".encode() + data
    return data


def pytest_counts(junit: str, log: str, collect_only: bool = False) -> dict:
    """Test counts of one pytest run: ``tests``, ``passed``, ``failed``, ``errors``, ``skipped``
    and the ``not_passed`` tests with their messages, from the junit XML when it exists, else
    from the verbose log (``source`` says which); ``collected`` for a collect-only run."""
    if collect_only:
        ids = [line for line in _lines(log) if "::" in line and not line.startswith(" ")]
        return {"source": "collect-only", "collected": len(ids)}
    if junit and Path(junit).is_file():
        try:
            return _junit_counts(Path(junit))
        except ET.ParseError:
            pass
    outcomes: dict[str, str] = {}
    for line in _lines(log):
        match = _OUTCOME_LINE.match(line)
        if match and (match["a"] or match["b"]) in OUTCOMES:
            outcomes[match["ida"] or match["idb"]] = match["a"] or match["b"]
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    names = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors"}
    for outcome in outcomes.values():
        counts[names.get(outcome, "skipped")] += 1
    not_passed = [f"{i}: {o}" for i, o in outcomes.items() if o not in ("PASSED", "XPASS")]
    return {
        "source": "log (no junit XML: pytest was stopped?)",
        "tests": len(outcomes),
        **counts,
        "not_passed": not_passed[:MAX_NOT_PASSED],
    }


def _junit_counts(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    not_passed = []
    for suite in suites:
        for key, attr in (("tests", "tests"), ("failed", "failures"), ("errors", "errors")):
            counts[key] += int(suite.get(attr, 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        for case in suite.iter("testcase"):
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    message = (child.get("message") or child.text or "").strip()
                    case_id = f"{case.get('classname')}::{case.get('name')}"
                    not_passed.append(f"{case_id}: {child.tag}: {message[:200]}")
                    break
    passed = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    return {
        "source": "junit",
        **counts,
        "passed": passed,
        "not_passed": not_passed[:MAX_NOT_PASSED],
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
