"""The thread scenario's settings and its OpenMP environment for the stack's processes."""

from __future__ import annotations

import os

import pytest

from zerolayer.bench.threads import openmp_environment, settings_for


def test_settings_cover_the_default_each_count_and_the_waiting_policies() -> None:
    settings = {s.label: s for s in settings_for(2, ["10000"])}
    assert list(settings) == ["default", "1 threads", "2 threads", "2 threads spin 10000"]
    assert settings["default"].num_threads == 0 and settings["default"].openmp_env == {}
    assert settings["2 threads spin 10000"].openmp_env == {"GOMP_SPINCOUNT": "10000"}


def test_openmp_environment_replaces_both_variables_and_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with openmp_environment({"OMP_WAIT_POLICY": "passive"}):
        assert os.environ["OMP_WAIT_POLICY"] == "passive"
        assert "GOMP_SPINCOUNT" not in os.environ
    assert os.environ["GOMP_SPINCOUNT"] == "5" and "OMP_WAIT_POLICY" not in os.environ
    with openmp_environment({}):
        assert "GOMP_SPINCOUNT" not in os.environ
    assert os.environ["GOMP_SPINCOUNT"] == "5"


def test_verdict_needs_the_default_and_another_setting() -> None:
    from zerolayer.bench.threads import verdict

    assert verdict({"quiet": {"default": {"1": 5.0}}, "busy": {"default": {"1": 4.0}}}, [1]) == {}
    results = {
        "quiet": {"default": {"1": 9.0}, "1 threads": {"1": 10.0}},
        "busy": {"default": {"1": 6.0}, "1 threads": {"1": 8.0}},
    }
    assert verdict(results, [1])["1"]["default_vs_best_quiet"] == pytest.approx(0.9)


def test_only_refuses_unknown_settings_before_starting_anything(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "zerolayer.cli.main", "bench", "threads", "--only", "bogus"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--only: unknown setting bogus" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()
