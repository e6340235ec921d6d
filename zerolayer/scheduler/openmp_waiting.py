"""How the engine's OpenMP threads wait at a barrier: a short spin, unless the user chose.

torch's CPU kernels (and ours, through ``at::parallel_for``) run on GNU OpenMP (libgomp). A thread
that reaches the end of a parallel region first waits for the others: by default it spins for
``GOMP_SPINCOUNT`` iterations (300,000) before it sleeps on a futex. With one thread per core,
any other busy process on the machine preempts one of them while its partner spins on the other
core, so every barrier of the forward costs a scheduler time slice: batch-1 decode through the
services fell from 38.8 to 2.3 tok/s beside one busy process. Sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) avoids that but pays a futex wake-up at every barrier (32.0 tok/s
quiet). A spin of 100 iterations catches the partner that is about to arrive and sleeps soon
when it is not: 37.4 tok/s quiet and 22.6 beside the busy process (docs/benchmarks.md,
"threads"; the same 2-core machine, one run after another). libgomp reads both variables once,
when it is loaded (``import torch``), so they are set before that, in the scheduler's process.

Source: the GNU libgomp manual, "OMP_WAIT_POLICY" and "GOMP_SPINCOUNT".
"""

from __future__ import annotations

from collections.abc import MutableMapping

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
DEFAULT_SPIN_COUNT = "100"


def default_openmp_waiting(environ: MutableMapping[str, str]) -> str:
    """Sets ``GOMP_SPINCOUNT=100`` in ``environ`` unless ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` is already set (the user's choice wins).

    Call it before torch is imported: libgomp reads the environment once, when it is loaded.

    Args:
        environ: the process environment (``os.environ``), changed in place.

    Returns:
        What is in force, for the log: ``"GOMP_SPINCOUNT=100 (default)"``, or the user's
        ``"OMP_WAIT_POLICY=... (set)"`` / ``"GOMP_SPINCOUNT=... (set)"``.
    """
    for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV):
        if name in environ:
            return f"{name}={environ[name]} (set)"
    environ[SPIN_COUNT_ENV] = DEFAULT_SPIN_COUNT
    return f"{SPIN_COUNT_ENV}={DEFAULT_SPIN_COUNT} (default)"
