"""``--gpu-strict`` (tests/conftest.py), what scripts/device_check.sh runs the gpu tests with:
every gpu-marked test runs, and one that skips or xfails, or a module skipped at collection, fails
with its reason. Runs the conftest's own text in a pytester directory."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()

GPU_TESTS = """
import pytest


@pytest.mark.gpu
def test_runs():
    pass


@pytest.mark.gpu
def test_skips_inside():
    pytest.skip("triton does not import")


@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs CUDA and cuda-bindings")
def test_skipped_by_its_mark():
    pass


@pytest.mark.gpu
def test_xfails():
    pytest.xfail("NVML reports no processes")


def test_not_gpu_may_skip():
    pytest.skip("unrelated")
"""

SKIPPED_MODULE = """
import pytest

pytest.importorskip("no_such_module_here")


@pytest.mark.gpu
def test_never_collected():
    pass
"""


@pytest.fixture
def gpu_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    pytester.makepyfile(test_gpu=GPU_TESTS, test_module_skip=SKIPPED_MODULE)
    return pytester


def test_under_gpu_strict_every_skip_of_a_gpu_test_fails(gpu_dir: pytest.Pytester) -> None:
    result = gpu_dir.runpytest(
        "--gpu-strict", "--continue-on-collection-errors", "-rfE", "-p", "no:cacheprovider"
    )
    # The mark's skip happens in setup (an error); the others in the call (failures).
    result.assert_outcomes(passed=1, failed=2, errors=2, skipped=1)
    result.stdout.fnmatch_lines_random(
        [
            "FAILED test_gpu.py::test_skips_inside - *",
            "FAILED test_gpu.py::test_xfails - *",
            "ERROR test_gpu.py::test_skipped_by_its_mark - *",
            "ERROR test_module_skip.py - *",
        ]
    )
    lines = result.stdout.lines
    for reason in (
        "gpu-marked test skipped under --gpu-strict: Skipped: triton does not import",
        "gpu-marked test skipped under --gpu-strict: Skipped: needs CUDA and cuda-bindings",
        "gpu-marked test skipped under --gpu-strict: NVML reports no processes",
        "module skipped under --gpu-strict: Skipped: could not import 'no_such_module_here': No "
        "module named 'no_such_module_here'",
    ):
        assert reason in lines


def test_without_it_skips_stay_skips(gpu_dir: pytest.Pytester, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # deselection needs no CUDA device: none here
    result = gpu_dir.runpytest("-p", "no:cacheprovider", "-m", "not gpu")
    result.assert_outcomes(skipped=2, deselected=4)
