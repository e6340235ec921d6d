"""``zerolayer up --print-commands``: the command line of each process ``up`` would run, to run
(or restart) one layer by hand exactly as ``up`` does."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from zerolayer.common.server import LAUNCHER_PID_ENV
from zerolayer.stack.config import StackConfig
from zerolayer.stack.launcher import Stack, StackError


def print_commands(config: StackConfig) -> int:
    """Prints ``# <process>`` and its command line (shell-quoted) for each process of the stack,
    in start order; starts nothing and leaves no run directory behind. Returns the exit code: 0,
    or 1 when the run directory cannot be used (one line on stderr).

    The commands are run from the repository root, as ``up`` runs them; ``up`` also sets
    ``ZEROLAYER_LAUNCHER_PID`` in their environment (the layer exits when ``up`` dies), which a
    layer started by hand goes without.
    """
    made = config.run_dir is None or not os.path.exists(config.run_dir)
    try:
        stack = Stack(config)
    except StackError as exc:
        print(f"zerolayer up: error: {exc}", file=sys.stderr)
        return 1
    try:
        for name in stack.slots:
            print(f"# {name}")
            print(shlex.join(stack.command(name)))
    finally:
        if made:
            shutil.rmtree(stack.run_dir, ignore_errors=True)
    if config.run_dir is None:
        print(
            f"zerolayer up: {stack.run_dir} is an example: each up makes a new run directory; "
            "give --run-dir DIR for the commands of a stack started with it",
            file=sys.stderr,
        )
    print(
        f"zerolayer up: up also runs each from {Stack.working_dir()} with {LAUNCHER_PID_ENV} "
        "set (a layer then exits when up dies); a layer you start by hand goes without",
        file=sys.stderr,
    )
    return 0
