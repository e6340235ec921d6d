"""How to run the four layers of one deployment: the launcher's frozen configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from zerolayer.common.config import (
    AccessSettings,
    ApiSettings,
    ArenaSettings,
    DeviceSettings,
    EngineSettings,
    MetricsSettings,
    ModelSettings,
    RoutingSettings,
    check_settings,
    documented,
    setting_field,
)
from zerolayer.common.device import resolve_device
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


@documented
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
    inherits, which the layers' configs share), and the stack's own. A relative ``run_dir`` is
    made absolute against the current directory at construction, so the pre-flight check, the
    launcher and the layers (which run elsewhere) name the same one; the metrics ports are
    :func:`zerolayer.stack.layout.metrics_ports`'."""

    run_dir: str | None = setting_field(RUN_DIR)
    supervise: bool = setting_field(SUPERVISE)
    metrics_port_base: int = setting_field(METRICS_PORT_BASE)
    schedulers: int = setting_field(SCHEDULERS)
    standby_schedulers: int = setting_field(STANDBY_SCHEDULERS)
    frontends: int = setting_field(FRONTENDS)
    log_dir: str | None = None
    """Write each layer's stderr to ``<log_dir>/<layer>.log``; None: inherit this process's."""
    startup_timeout_s: float = setting_field(STARTUP_TIMEOUT_S)
    max_restart_backoff_s: float = 10.0
    """Longest wait before restarting a layer that keeps dying, seconds."""

    def __post_init__(self) -> None:
        """Checks the settings before any process starts, by their declarations.

        Raises:
            ValueError: a setting is out of range; the message starts with its flag.
        """
        check_settings(self)
        self._check_metrics_port_base()
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", os.path.abspath(self.run_dir))
        if self.device != "cpu":  # resolving a GPU imports torch: only when one is asked for
            object.__setattr__(self, "device", str(resolve_device(self.device)))

    def with_absolute_paths(self) -> StackConfig:
        """This config with ``--model`` and the access files (``--tls-cert``, ``--tls-key``,
        ``--tls-client-ca``, ``--tenants``) made absolute against the current directory: the
        layers run elsewhere (:meth:`Stack.working_dir`). Called after the pre-flight checks,
        whose errors keep the path as the user wrote it (a hub id is told by its spelling)."""
        names = ("model_dir", "tls_cert", "tls_key", "tls_client_ca", "tenants", "log_dir")
        absolute = {n: os.path.abspath(getattr(self, n)) for n in names if getattr(self, n)}
        return replace(self, **absolute)

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
