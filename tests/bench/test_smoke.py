"""Benchmarks are not tests: CI only proves each scenario runs and writes valid results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.stack import free_port

pytestmark = pytest.mark.e2e


def test_multiturn_smoke_writes_json_and_png(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "bench",
            "multiturn",
            "--smoke",
            "--out",
            str(tmp_path),
            "--port",
            str(free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "multiturn.json").read_text())
    assert results["scenario"] == "multiturn"
    assert results["command"].startswith("zerolayer bench multiturn --smoke")
    systems = results["ttft_s_per_turn"]
    assert set(systems) == {"zerolayer_prefix_caching", "zerolayer_no_caching", "hf_transformers"}
    assert all(len(ttfts) == 2 and all(t > 0 for t in ttfts) for ttfts in systems.values())
    assert (tmp_path / "multiturn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
