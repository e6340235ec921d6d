"""What a checkout adds to ``zerolayer bench`` (zerolayer/bench/checkout.py): found beside the
package in this checkout, absent anywhere else (as in an installed wheel)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from zerolayer.bench import checkout
from zerolayer.bench.checkout import NOT_COMPARED, Comparison, baseline_for, compared


def test_this_checkout_gives_the_scenarios_their_baselines() -> None:
    benchmarks = checkout.checkout_benchmarks()
    assert benchmarks is not None
    assert Path(benchmarks.__file__) == checkout.CHECKOUT_ROOT / "benchmarks" / "__init__.py"
    assert baseline_for("throughput").__name__ == "benchmarks.hf.throughput"
    assert baseline_for("split") is None  # compares zerolayer with itself
    assert baseline_for("agent").__name__ == "benchmarks.llamacpp.agent"  # llama-server
    assert checkout.checkout_scenarios() == {
        "llamacpp": "benchmarks.llamacpp.scenario",
        "gguf": "benchmarks.llamacpp.gguf_scenario",
    }


def test_without_a_checkout_nothing_is_added(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checkout, "CHECKOUT_ROOT", tmp_path)
    monkeypatch.delitem(sys.modules, "benchmarks", raising=False)
    assert checkout.checkout_benchmarks() is None
    assert baseline_for("throughput") is None and checkout.checkout_scenarios() == {}


def test_a_benchmarks_package_from_elsewhere_is_not_taken(tmp_path: Path, monkeypatch) -> None:
    other = tmp_path / "benchmarks"
    other.mkdir()
    (other / "__init__.py").write_text('"""someone else\'s"""\nSCENARIOS = {"x": "y"}\n')
    monkeypatch.delitem(sys.modules, "benchmarks", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    import benchmarks

    assert Path(benchmarks.__file__) == other / "__init__.py"
    assert checkout.checkout_benchmarks() is None


def test_a_comparison_joins_the_scenario_s_results_one_level_deep() -> None:
    results = {"torch_threads": {"zerolayer_scheduler": 2}, "targets": {"a": ">= 1"}, "x": 1}
    comparison = Comparison({"torch_threads": {"hf": 2}, "targets": {"b": "<= 2"}, "x": 3})
    assert compared(results, comparison) == {
        "torch_threads": {"zerolayer_scheduler": 2, "hf": 2},
        "targets": {"a": ">= 1", "b": "<= 2"},
        "x": 3,
    }
    assert results["targets"] == {"a": ">= 1"}  # not modified
    assert compared(results, None) == {**results, "baseline": NOT_COMPARED}


@pytest.fixture(autouse=True)
def _checkout_benchmarks_restored():
    """The tests above unload ``benchmarks``; later tests find this checkout's again."""
    yield
    if getattr(sys.modules.get("benchmarks"), "__file__", None) != str(
        checkout.CHECKOUT_ROOT / "benchmarks" / "__init__.py"
    ):
        sys.modules.pop("benchmarks", None)
