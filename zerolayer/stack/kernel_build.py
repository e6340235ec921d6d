"""The scheduler's native CPU kernels, built before the layers start, so that no start-up deadline
counts the build.

``zerolayer up`` runs the scheduler's build program by module name, as it runs the layers
(``python -m zerolayer.scheduler.model.native.build``), and waits for it without a deadline. The
program answers at once when the library of the current sources is built (at install time, or
by an earlier run), compiles it otherwise (seconds; its progress line goes to stderr), and waits
for a build another process started. It dies, compilers and all, with this process
(``--parent-pid``), and is killed when start-up is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from zerolayer.stack.config import StackConfig

BUILD_MODULE = "zerolayer.scheduler.model.native.build"
"""The scheduler's kernel build program."""
POLL_S = 0.05
"""How often an interruption is looked for while the build runs, seconds."""
BAD_SETTING_EXIT = 3
"""The build program's exit code for a setting it refuses (an unknown ``$ZEROLAYER_CPU_ISA``):
``EXIT_BAD_SETTING`` of the scheduler's build module, which the stack does not import."""


class KernelSettingError(ValueError):
    """The environment asks for a kernel variant that does not exist; the message names the
    variable and the choices."""


def needs_native_kernels(config: StackConfig) -> bool:
    """Whether the stack's schedulers run the CPU kernels: a CPU device and the native attention
    backend (``--attention-backend reference`` and a GPU build nothing)."""
    return config.device == "cpu" and config.attention_backend == "native"


def build_native_kernels(cwd: Path, interrupted: Callable[[], bool]) -> str | None:
    """Runs the build program to its end, from ``cwd`` (where the ``zerolayer`` package is).

    Returns:
        None when the kernels are built; else the program's reason (no compiler, or the
        compiler's error), which the scheduler then meets too: it logs it and serves on the
        pure-torch path.

    Raises:
        InterruptedError: ``interrupted()`` became true; the build was killed.
        KernelSettingError: ``$ZEROLAYER_CPU_ISA`` names no variant (the program's line).
    """
    process = subprocess.Popen(
        [sys.executable, "-m", BUILD_MODULE, "--parent-pid", str(os.getpid())],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its compilers are in its group: one signal stops them all
    )
    with process:
        while True:
            try:
                process.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                if interrupted():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    raise InterruptedError(
                        "interrupted while building the native kernels"
                    ) from None
        answer = process.stdout.read().strip() if process.stdout else ""
    if process.returncode == BAD_SETTING_EXIT:
        raise KernelSettingError(answer)
    return None if process.returncode == 0 else answer or f"exit code {process.returncode}"
