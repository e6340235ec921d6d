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
