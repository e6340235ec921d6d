"""``zerolayer up``'s own flags, which no layer takes: the run directory, supervision, the
metrics ports, how many schedulers and frontends run, and how long they may take to start.
``zerolayer.common.settings`` holds the layers' flags and collects these into its ``SETTINGS``."""

from __future__ import annotations

from zerolayer.common.setting import AtMost, Setting, non_negative, positive

MAX_PROCESSES = 64
"""Most processes of each kind ``--schedulers``, ``--standby-schedulers`` and ``--frontends``
ask for: each is a process with its own memory, started one after another."""

RUN_DIR = Setting(
    "run_dir",
    "--run-dir",
    "directory for the internal unix sockets (made with mode 0700)",
    default=None,
    metavar="DIR",
    default_note="a new private temporary directory",
    up=True,
)
SUPERVISE = Setting(
    "supervise",
    "--no-supervise",
    "do not restart layers that exit (an exit is logged; a standby scheduler is still promoted)",
    default=True,
    up=True,
)
# NOTE: no check of its own: its range depends on the number of processes (StackConfig checks it).
METRICS_PORT_BASE = Setting(
    "metrics_port_base",
    "--metrics-port-base",
    "Prometheus ports: loader N, kvstore N+1, scheduler N+2, frontend N+3, then the other "
    "schedulers (active, then standby) and the other frontends from N+4 on",
    default=0,
    metavar="N",
    default_note="off",
    up=True,
)
SCHEDULERS = Setting(
    "schedulers",
    "--schedulers",
    "active schedulers, each a process of its own on the one kvstore and the same mapped "
    "weights; --num-threads applies to each",
    default=1,
    check=AtMost(positive, MAX_PROCESSES),
    metavar="N",
    up=True,
)
STANDBY_SCHEDULERS = Setting(
    "standby_schedulers",
    "--standby-schedulers",
    "warmed schedulers that take no traffic until an active one dies: the supervisor then "
    "promotes one at once and starts the dead one again as the new standby",
    default=0,
    check=AtMost(non_negative, MAX_PROCESSES),
    metavar="K",
    up=True,
)
FRONTENDS = Setting(
    "frontends",
    "--frontends",
    "frontend processes sharing the --listen port (SO_REUSEPORT): one that dies fails only the "
    "calls it carried",
    default=1,
    check=AtMost(positive, MAX_PROCESSES),
    metavar="M",
    up=True,
)

STARTUP_TIMEOUT_S = Setting(
    "startup_timeout_s",
    "--startup-timeout-s",
    "how long the layers may take to report SERVING once started; a native kernel build before "
    "them is not counted",
    default=180.0,
    check=positive,
    unit="s",
    metavar="S",
    up=True,
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
