"""How the engine's OpenMP threads wait at a barrier: passively, unless the user chose otherwise.

torch's CPU kernels (and ours, through ``at::parallel_for``) run on GNU OpenMP (libgomp). A thread
that reaches the end of a parallel region first waits for the others: by default it spins for
``GOMP_SPINCOUNT`` iterations (300,000) before it sleeps on a futex. With one thread per core,
any other busy process on the machine preempts one of them, and its partner spins on the other
core meanwhile, so every barrier of the forward costs a scheduler time slice: batch-1 decode
through the services fell from 27.8 to 1.5 tok/s beside one busy process (docs/benchmarks.md,
"threads"). ``OMP_WAIT_POLICY=PASSIVE`` makes a waiting thread sleep at once and give its core
away. libgomp reads both variables once, when it is loaded (``import torch``), so they are set
before that, in the scheduler's process only.

Source: the GNU libgomp manual, "OMP_WAIT_POLICY" and "GOMP_SPINCOUNT".
"""

from __future__ import annotations

from collections.abc import MutableMapping

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
DEFAULT_WAIT_POLICY = "PASSIVE"


def prefer_passive_waiting(environ: MutableMapping[str, str]) -> str:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` is already set (the user's choice wins).

    Call it before torch is imported: libgomp reads the environment once, when it is loaded.

    Args:
        environ: the process environment (``os.environ``), changed in place.

    Returns:
        What is in force, for the log: ``"OMP_WAIT_POLICY=PASSIVE"``, or the user's
        ``"OMP_WAIT_POLICY=..."`` / ``"GOMP_SPINCOUNT=..."``.
    """
    for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV):
        if name in environ:
            return f"{name}={environ[name]}"
    environ[WAIT_POLICY_ENV] = DEFAULT_WAIT_POLICY
    return f"{WAIT_POLICY_ENV}={DEFAULT_WAIT_POLICY}"
