"""``zerolayer bench`` before it starts anything: the packages of the bench extra, and plots."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
from e2e.stack import free_port

from zerolayer.bench.cli import missing_requirements, scenario_modules
from zerolayer.bench.common import integer_ticks
from zerolayer.cli.main import main


def test_a_checkout_adds_the_comparisons_and_the_packages_they_need(monkeypatch) -> None:
    """From this checkout: the llama.cpp scenarios, and transformers for the wheel scenarios'
    baselines (looked up: a missing one is named)."""
    assert list(scenario_modules())[-2:] == ["llamacpp", "gguf"]
    assert scenario_modules()["llamacpp"] == "benchmarks.llamacpp.scenario"
    assert scenario_modules()["gguf"] == "benchmarks.llamacpp.gguf_scenario"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    assert missing_requirements("chat") == ["matplotlib", "transformers"]
    assert missing_requirements("split") == ["matplotlib"]  # no baseline: nothing else to run


@pytest.mark.parametrize("scenario", ["multiturn", "chat"])
def test_a_missing_package_is_one_line_naming_the_extra_before_anything_starts(
    scenario: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = importlib.util.find_spec

    def without_transformers(name: str, *args: object):  # noqa: ANN202 - find_spec's type
        return None if name == "transformers" else found(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_transformers)
    assert main(["bench", scenario, "--smoke", "--out", "/nonexistent/out"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"zerolayer bench {scenario}: error: needs transformers, not installed: pip install "
        "'zerolayer[bench]' (from a clone: .venv/bin/pip install -e '.[bench]')\n"
    )


def test_whole_number_xs_get_whole_number_ticks() -> None:
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.plot([1, 2], [0.5, 0.7])
    integer_ticks(ax, [1, 2])
    assert all(tick == int(tick) for tick in ax.get_xticks())
    fractional = Figure().subplots()
    fractional.plot([1, 2], [0.5, 0.7])
    integer_ticks(fractional, [1.0, 2.0])
    assert any(tick != int(tick) for tick in fractional.get_xticks())  # matplotlib's own


def test_a_refused_checkpoint_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    port = str(free_port())
    code = main(
        ["bench", "int8", "--smoke", "--group-size", "3", "--out", str(tmp_path), "--port", port]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("zerolayer bench int8: error: tensor ") and err.count("\n") == 1
    assert "is not a multiple of --group-size 3" in err


@pytest.mark.parametrize("num_panels", [1, 3])
def test_a_long_title_is_wrapped_inside_the_figure(num_panels: int, tmp_path: Path) -> None:
    from matplotlib.image import imread

    from zerolayer.bench.plots import plot_bars

    title = "Throughput, 64 requests at once (256 prompt, 128 new tokens) " * num_panels
    panels = {
        f"panel {i}": {"zerolayer": 333.0, "HF padded batch": 19.3} for i in range(num_panels)
    }
    pixels = imread(plot_bars(tmp_path / "bars.png", title, panels))
    band = pixels[:60, :, :3]  # the title's rows
    assert band.min() < 0.5  # the title is drawn
    assert (band[:, :4] == 1.0).all() and (band[:, -4:] == 1.0).all()  # and no letter is cut


def test_a_taken_port_is_one_line_before_anything_runs(tmp_path: Path, capsys) -> None:
    # It once failed with a traceback after the baseline's whole run.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["bench", "throughput", "--smoke", "--out", str(tmp_path), "--port", str(port)])
    assert code == 2 and not (tmp_path / "logs").exists()
    assert capsys.readouterr().err == (
        f"zerolayer bench throughput: error: --port {port}: the port is already in use "
        "(another bench or stack? choose another with --port)\n"
    )


@pytest.mark.parametrize("scenario", list(scenario_modules()))
def test_each_scenarios_smoke_overrides_are_its_own_flags(scenario: str) -> None:
    # What the smoke runs of one scenario per family leave to this check for the others: their
    # --smoke settings still name flags they have.
    from zerolayer.bench.checkout import baseline_for
    from zerolayer.cli.main import build_parser

    args = build_parser("bench").parse_args(["bench", scenario, "--smoke"])
    module = importlib.import_module(scenario_modules()[scenario])
    baseline = baseline_for(scenario)
    overrides = {**module.SMOKE, **(baseline.SMOKE if baseline else {})}
    assert overrides and all(hasattr(args, name) for name in overrides), overrides


def test_a_scenario_may_choose_its_preset_and_size_its_pool() -> None:
    from zerolayer.cli.main import build_parser

    parser = build_parser("bench")
    agent = parser.parse_args(["bench", "agent"])
    assert (agent.preset, agent.kv_cache_bytes) == ("tiny", None)
    multiturn = parser.parse_args(["bench", "multiturn"])
    assert (multiturn.preset, multiturn.kv_cache_bytes) == ("small", 1 << 30)
    assert (
        parser.parse_args(["bench", "agent", "--kv-cache-bytes", "64M"]).kv_cache_bytes == 64 << 20
    )
