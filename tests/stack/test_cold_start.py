"""What the processes of ``zerolayer up`` leave out of their start-up (issue 18, cold start):
each check runs in a fresh interpreter, as a layer starts, and looks at what it imported or
ran. On this 2-core machine the four layers start at once and share the cores, so a second of
imports that a layer does not need is taken from the scheduler's torch import (the longest
path to the first token)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from zerolayer.checkpoints.dummy import ensure_dummy_model
from zerolayer.scheduler.model.native import build


def fresh_python(code: str) -> str:
    """Runs ``code`` in a new interpreter and asserts that it succeeded; its stdout, stripped."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_up_starts_its_first_layer_without_importing_numpy() -> None:
    # up's own path (flags, pre-flight, checkpoint read) until it would spawn the loader
    model_dir = ensure_dummy_model("tiny")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = (
        "import sys\n"
        "from zerolayer.stack.launcher import Stack\n"
        "def first(self, name):\n"
        "    print(name, 'numpy' in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "Stack.start_layer = first\n"
        "from zerolayer.cli.main import main\n"
        f"main(['up', '--model', {str(model_dir)!r}, '--listen', '127.0.0.1:{port}'])"
    )
    assert fresh_python(code) == "loader False"


def test_a_frontend_without_http_listen_imports_no_fastapi_uvicorn_or_numpy() -> None:
    code = (
        "import sys, zerolayer.frontend.__main__\n"
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn', 'numpy') if m in sys.modules))"
    )
    assert fresh_python(code) == "[]"


def test_the_kvstore_starts_without_importing_numpy() -> None:
    assert fresh_python(
        "import sys, zerolayer.kvstore.__main__; print('numpy' in sys.modules)"
    ) == ("False")


def test_a_layer_started_by_up_asks_for_sighup_without_running_ldconfig() -> None:
    # NOTE: ctypes.util.find_library("c") runs /sbin/ldconfig -p in a subprocess
    code = (
        "import ctypes, os, subprocess\n"
        "def refuse(*args, **kwargs): raise AssertionError(f'started {args[0]!r}')\n"
        "subprocess.Popen = refuse\n"
        "from zerolayer.common.server import exit_with_launcher\n"
        "exit_with_launcher({'ZEROLAYER_LAUNCHER_PID': str(os.getppid())})\n"
        "signum = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(signum), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(signum.value)"
    )
    assert fresh_python(code) == "1"  # SIGHUP


def test_the_install_time_kernels_load_without_running_a_compiler() -> None:
    if build.built_library(build.PREBUILT_DIR, build.source_digest()) is None:
        pytest.skip("csrc/ changed since pip install -e . (or no compiler then)")
    code = (
        "import subprocess, sys, torch\n"  # torch's own import runs ldconfig
        "def refuse(*args, **kwargs): raise AssertionError(f'started {args[0]!r}')\n"
        "subprocess.Popen = refuse\n"
        "from zerolayer.scheduler.model.kernels import KernelLoader\n"
        "loader = KernelLoader()\n"
        "assert loader.native_available(), loader.unavailable_reason\n"
        "print(sorted(m for m in ('torch.utils.cpp_extension', 'setuptools') if m in sys.modules))"
    )
    assert fresh_python(code) == "[]"
