"""``zerolayer up``'s own flags, which no layer takes: the run directory, supervision, the
metrics ports, how many schedulers and frontends run, and how long they may take to start.
``zerolayer.common.settings`` holds the layers' flags and collects these into its ``SETTINGS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zerolayer.common.setting import AtMost, Setting, non_negative, positive

MAX_PROCESSES = 64
"""Most processes of each kind ``--schedulers``, ``--standby-schedulers`` and ``--frontends``
ask for: each is a process with its own memory, started one after another."""


def offered(flag: str, help: str, default: Any, **more: Any) -> Setting:
    """A setting ``zerolayer up`` offers, named after its flag (``--max-num-seqs``:
    ``max_num_seqs``); ``more`` are its other :class:`Setting` fields."""
    name = flag.removeprefix("--").replace("-", "_")
    return Setting(name, flag, help, default, up=True, **more)


def processes(
    flag: str, help: str, default: int, fewest: Callable[[int], None], metavar: str
) -> Setting:
    """How many processes of a kind ``zerolayer up`` runs: checked by ``fewest``
    (:func:`positive` or :func:`non_negative`) and at most :data:`MAX_PROCESSES`."""
    return offered(flag, help, default, check=AtMost(fewest, MAX_PROCESSES), metavar=metavar)


RUN_DIR = offered(
    "--run-dir",
    "directory for the internal unix sockets (made with mode 0700)",
    default=None,
    metavar="DIR",
    default_note="a new private temporary directory",
)
SUPERVISE = Setting(
    "supervise",
    "--no-supervise",
    "do not restart layers that exit (an exit is logged; a standby scheduler is still promoted)",
    default=True,
    up=True,
)
# NOTE: no check of its own: its range depends on the number of processes (StackConfig checks it).
METRICS_PORT_BASE = offered(
    "--metrics-port-base",
    "Prometheus ports: loader N, kvstore N+1, scheduler N+2, frontend N+3, then the other "
    "schedulers (active, then standby) and the other frontends from N+4 on",
    default=0,
    metavar="N",
    default_note="off",
)
SCHEDULERS = processes(
    "--schedulers",
    "active schedulers, each a process of its own on the one kvstore and the same mapped "
    "weights; --num-threads applies to each",
    1,
    positive,
    "N",
)
STANDBY_SCHEDULERS = processes(
    "--standby-schedulers",
    "warmed schedulers that take no traffic until an active one dies: the supervisor then "
    "promotes one at once and starts the dead one again as the new standby",
    0,
    non_negative,
    "K",
)
FRONTENDS = processes(
    "--frontends",
    "frontend processes sharing the --listen port (SO_REUSEPORT): one that dies fails only the "
    "calls it carried",
    1,
    positive,
    "M",
)

STARTUP_TIMEOUT_S = offered(
    "--startup-timeout-s",
    "how long the layers may take to report SERVING once started; a native kernel build before "
    "them is not counted",
    180.0,
    check=positive,
    unit="s",
    metavar="S",
)

STACK_SETTINGS = (
    RUN_DIR,
    SUPERVISE,
    METRICS_PORT_BASE,
    SCHEDULERS,
    STANDBY_SCHEDULERS,
    FRONTENDS,
    STARTUP_TIMEOUT_S,
)
"""The declarations above, in order."""
