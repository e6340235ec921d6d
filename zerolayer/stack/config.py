"""How to run the four layers of one deployment: the launcher's frozen configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from zerolayer.common.config import (
    AccessSettings,
    ApiSettings,
    ArenaSettings,
    DeviceSettings,
    EngineSettings,
    MetricsSettings,
    ModelSettings,
    RoutingSettings,
)
from zerolayer.common.device import resolve_device
from zerolayer.common.settings import SETTINGS
from zerolayer.common.stack_settings import (
    FRONTENDS,
    METRICS_PORT_BASE,
    RUN_DIR,
    SCHEDULERS,
    STANDBY_SCHEDULERS,
    STARTUP_TIMEOUT_S,
    SUPERVISE,
)
from zerolayer.stack.layout import Slot, metrics_ports, stack_slots

SHM_DIR = "/dev/shm"
"""Where ``zerolayer up`` creates the KV arena file (``<SHM_DIR>/<instance id>.kv``, see
``zerolayer.stack.launcher.stack_instance_id``)."""


@dataclass(frozen=True, kw_only=True)
class StackConfig(
    ModelSettings,
    ArenaSettings,
    EngineSettings,
    ApiSettings,
    AccessSettings,
    RoutingSettings,
    DeviceSettings,
    MetricsSettings,
):
    """How to run the four layers: every layer setting ``zerolayer up`` offers (the groups it
    inherits, which the layers' configs share), and the stack's own."""

    run_dir: str | None = RUN_DIR.default
    """Directory for the internal unix sockets; None: a new private (0700) temporary directory.
    A relative one is made absolute against the current directory at construction, so the
    pre-flight check, the launcher and the layers (which run elsewhere) name the same one."""
    supervise: bool = SUPERVISE.default
    """Restart a layer that exits or is killed (with backoff) while the others keep running."""
    metrics_port_base: int = METRICS_PORT_BASE.default
    """Prometheus ports: loader +0, kvstore +1, scheduler +2, frontend +3, the other processes
    from +4 on (see :func:`zerolayer.stack.layout.metrics_ports`); 0: no endpoints."""
    schedulers: int = SCHEDULERS.default
    """Active schedulers (each its own process, all on the one kvstore)."""
    standby_schedulers: int = STANDBY_SCHEDULERS.default
    """Warmed standby schedulers, promoted by the supervisor when an active one dies."""
    frontends: int = FRONTENDS.default
    """Frontend processes sharing the ``listen`` port."""
    log_dir: str | None = None
    """Write each layer's stderr to ``<log_dir>/<layer>.log``; None: inherit this process's."""
    startup_timeout_s: float = STARTUP_TIMEOUT_S.default
    """How long the layers may take to report SERVING once started (a kernel build before them
    is not counted), seconds."""
    max_restart_backoff_s: float = 10.0
    """Longest wait before restarting a layer that keeps dying, seconds."""

    def __post_init__(self) -> None:
        """Checks the settings before any process starts, by their declarations.

        Raises:
            ValueError: a setting is out of range; the message starts with its flag.
        """
        names = {field.name for field in fields(self)}
        for setting in SETTINGS:
            if setting.name in names:
                setting.validate(getattr(self, setting.name))
        self._check_metrics_port_base()
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", os.path.abspath(self.run_dir))
        if self.device != "cpu":  # resolving a GPU imports torch: only when one is asked for
            object.__setattr__(self, "device", str(resolve_device(self.device)))

    def _check_metrics_port_base(self) -> None:
        """Raises ValueError (``--metrics-port-base: ...``) unless every process's port is a TCP
        port."""
        highest = 65536 - len(self.slots)
        if self.metrics_port_base and not 1 <= self.metrics_port_base <= highest:
            raise ValueError(f"{METRICS_PORT_BASE.flag}: must be in 1..{highest} (or 0: off)")

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every process of the stack, in start order (see :mod:`zerolayer.stack.layout`)."""
        return stack_slots(self.schedulers + self.standby_schedulers, self.frontends)

    def metrics_port(self, name: str) -> int:
        """The /metrics port of the process ``name`` (a layer, or a slot such as
        ``scheduler-1``; 0: off).

        Raises:
            KeyError: the stack has no such process.
        """
        return metrics_ports(self.metrics_port_base, self.slots)[name]
