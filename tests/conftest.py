"""Shared test helpers: how this process's OpenMP threads wait, where the shared test data lives,
a folder with a short path (``short_dir``), the one stack a test session shares
(``shared_stack``), the two workers the whole suite runs on, and how ``gpu``-marked tests run.

Without a CUDA device ``gpu``-marked tests are deselected. ``--gpu-strict`` (what
``scripts/device_check.sh`` passes) runs every one of them wherever it is, and fails each that
skips or xfails, and every module skipped at collection: on the GPU run, a test that skips (Triton
or cuda-bindings does not import, no NVML) is a failure, not a pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from suite_workers import run_on_workers

from zerolayer.scheduler.openmp_waiting import SPIN_COUNT_ENV, default_openmp_waiting

if TYPE_CHECKING:
    from openai_conformance import OpenAISpec


def _import_torch_with_the_schedulers_openmp_waiting() -> None:
    """Imports torch here, with the short OpenMP spin the scheduler process sets for itself
    (zerolayer/scheduler/openmp_waiting.py: libgomp reads its environment once, when torch loads
    it), then gives the environment back as it was, so that the processes tests start see the
    user's (the scheduler's own default is tested there).

    The engines the tests run in this process are the scheduler's; with libgomp's default spin
    their two threads spin at every barrier, which on a busy 2-core machine costs up to 20 times
    the CPU time of the work (200 decode steps of stories260K: 7.7 s of CPU against 0.4 s).
    """
    had_spin_count = SPIN_COUNT_ENV in os.environ
    default_openmp_waiting(os.environ)
    import torch  # noqa: F401

    if not had_spin_count:
        os.environ.pop(SPIN_COUNT_ENV, None)


_import_torch_with_the_schedulers_openmp_waiting()

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    """../shared/models/stories260K (skips when the shared folder is absent)."""
    path = SHARED / "models" / "stories260K"
    if not path.exists():
        pytest.skip(f"shared test model missing: {path}")
    return path


@pytest.fixture(scope="session")
def openai_spec() -> OpenAISpec:
    """OpenAI's published schemas (../shared/specs/openai/openapi-subset.yaml, pinned), as an
    :class:`openai_conformance.OpenAISpec`: ``openai_spec(name, value)`` checks ``value``
    against the schema ``name`` (e.g. "ErrorResponse"), raising jsonschema's ValidationError
    that says what differs; ``openai_spec.check_answer(...)`` checks an HTTP answer by its route
    and ``openai_spec.client(base_url)`` is the official client checking every answer it reads
    (skips when the file is absent)."""
    from openai_conformance import SPEC_PATH, load_spec

    spec = load_spec()
    if spec is None:
        pytest.skip(f"shared API specification missing: {SPEC_PATH}")
    return spec


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """An empty folder with a short path in /tmp, removed afterwards (a unix socket's path has at
    most 107 bytes; pytest's tmp_path can be longer, e.g. under pytest-xdist)."""
    path = Path(tempfile.mkdtemp(prefix="zl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def dummy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dummy model (``zerolayer make-dummy``'s default preset), written once for the
    session. Tests only read it; a test that changes a model's files writes a model of its own."""
    from zerolayer.checkpoints.dummy import ensure_dummy_model

    return ensure_dummy_model(cache_dir=tmp_path_factory.mktemp("dummy-cache"))


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session's one running stack for tests that only read (:class:`e2e.stack.SharedStack`
    says what it serves and what a test may do with it); started on first use."""
    from e2e.stack import shared_stack as running_shared_stack

    with running_shared_stack(tmp_path_factory) as shared:
        yield shared


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into its workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The whole suite runs on two workers: :func:`suite_workers.run_on_workers`."""
    run_on_workers(config)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu-strict",
        action="store_true",
        help="run every gpu-marked test even without a CUDA device, and fail each one that skips "
        "or xfails and each module skipped at collection (scripts/device_check.sh)",
    )
    parser.addoption(
        "--every-scenario",
        action="store_true",
        help="also run the bench smoke tests marked every_scenario (one scenario of each family "
        "runs by default: tests/bench/test_smoke.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the tests of the shared stack last, deselects the ``every_scenario`` bench smoke
    tests (unless ``--every-scenario``) and ``gpu``-marked tests on a machine without a CUDA
    device (unless ``--gpu-strict``).

    The shared stack's tests run one after another at the end (otherwise in their order): the
    stack starts for the first of them and stops with the session right after the last, instead
    of idling beside the other tests (its four processes take about 2 s of CPU a minute). On two
    workers each has its own stack, and a file's tests go to one worker together, where the file
    comes in the order of its first test.

    gpu-marked tests are not skipped (a skip reads like a run): the summary line counts them as
    deselected and the terminal says why. ``scripts/device_check.sh`` runs them with ``-m gpu``
    on a GPU.
    """
    items.sort(key=lambda item: "shared_stack" in getattr(item, "fixturenames", ()))
    if os.environ.get("TRITON_INTERPRET") != "1":
        interpreted = [i for i in items if i.get_closest_marker("triton_interpreter") is not None]
        if interpreted:
            # Run by test_interpreter_cases_in_their_own_process, in a process started with it.
            config.hook.pytest_deselected(items=interpreted)
            config.stash[_DESELECTED_INTERPRETER] = len(interpreted)
            items[:] = [i for i in items if i.get_closest_marker("triton_interpreter") is None]
    if not config.getoption("--every-scenario"):
        more = [i for i in items if i.get_closest_marker("every_scenario") is not None]
        if more:
            config.hook.pytest_deselected(items=more)
            config.stash[_DESELECTED_SCENARIOS] = len(more)
            items[:] = [i for i in items if i.get_closest_marker("every_scenario") is None]
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu or config.getoption("--gpu-strict") or _cuda_device_count() > 0:
        return
    config.hook.pytest_deselected(items=gpu)
    items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
    config.stash[_DESELECTED_GPU] = len(gpu)


_DESELECTED_GPU = pytest.StashKey[int]()
_DESELECTED_INTERPRETER = pytest.StashKey[int]()
_DESELECTED_SCENARIOS = pytest.StashKey[int]()
_DESELECTED = {
    "gpu": _DESELECTED_GPU,
    "interpreter": _DESELECTED_INTERPRETER,
    "scenarios": _DESELECTED_SCENARIOS,
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a worker, hands the deselections it counted to the controller, whose summary says them
    (every worker collects the same tests; the controller collects none)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["deselected"] = {n: session.config.stash.get(k, 0) for n, k in _DESELECTED.items()}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001
    """On the controller: a worker's deselections (see pytest_collection_finish)."""
    for name, count in node.workeroutput.get("deselected", {}).items():
        node.config.stash[_DESELECTED[name]] = count


# NOTE: old-style hook wrappers: the GPU machine's pytest is not ours (any pytest >= 7 works).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Under ``--gpu-strict``, a gpu-marked test that skips or xfails fails, with the reason."""
    report = (yield).get_result()
    if (
        report.skipped
        and item.config.getoption("--gpu-strict")
        and item.get_closest_marker("gpu") is not None
    ):
        _fail_skipped(report, "gpu-marked test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under ``--gpu-strict``, a module skipped at collection (``pytest.importorskip``, a
    module-level skip) is a collection error: its gpu tests would not run."""
    report = (yield).get_result()
    if report.skipped and collector.config.getoption("--gpu-strict"):
        _fail_skipped(report, "module")


def _fail_skipped(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    """Turns a skipped (or xfailed) report into a failure whose message gives the reason."""
    reason = getattr(report, "wasxfail", "") or ""
    if isinstance(report.longrepr, tuple):  # a skip: (path, line number, "Skipped: reason")
        reason = report.longrepr[2]
    if hasattr(report, "wasxfail"):
        del report.wasxfail  # else reporters count it as an xfail again
    report.outcome = "failed"
    report.longrepr = f"{what} skipped under --gpu-strict: {reason}"


def pytest_report_header(config: pytest.Config) -> str:
    return "gpu-marked tests: run only where torch sees a CUDA device (scripts/device_check.sh)"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    interpreted = config.stash.get(_DESELECTED_INTERPRETER, 0)
    if interpreted:
        terminalreporter.write_line(
            f"{interpreted} triton_interpreter tests deselected here: they ran in the process "
            "test_interpreter_cases_in_their_own_process starts (TRITON_INTERPRET=1)"
        )
    scenarios = config.stash.get(_DESELECTED_SCENARIOS, 0)
    if scenarios:
        terminalreporter.write_line(
            f"{scenarios} bench smoke tests deselected: one scenario of each family ran "
            "(--every-scenario runs them all)"
        )
    count = config.stash.get(_DESELECTED_GPU, 0)
    if count:
        terminalreporter.write_line(
            f"{count} gpu-marked tests NOT RUN (no CUDA device here); run scripts/device_check.sh "
            "on a GPU machine"
        )
