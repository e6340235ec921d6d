"""How to run the four layers of one deployment: the launcher's frozen configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from zerolayer.common.config import (
    ApiSettings,
    ArenaSettings,
    DeviceSettings,
    EngineSettings,
    MetricsSettings,
    ModelSettings,
)
from zerolayer.common.device import resolve_device
from zerolayer.common.settings import LAYERS, METRICS_PORT_BASE, RUN_DIR, SETTINGS, SUPERVISE

SHM_DIR = "/dev/shm"
"""Where ``zerolayer up`` creates the KV arena file (``<SHM_DIR>/<instance id>.kv``, see
``zerolayer.stack.launcher.stack_instance_id``)."""


@dataclass(frozen=True, kw_only=True)
class StackConfig(
    ModelSettings, ArenaSettings, EngineSettings, ApiSettings, DeviceSettings, MetricsSettings
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
    """Prometheus ports: loader +0, kvstore +1, scheduler +2, frontend +3; 0: no endpoints."""
    log_dir: str | None = None
    """Write each layer's stderr to ``<log_dir>/<layer>.log``; None: inherit this process's."""
    startup_timeout_s: float = 180.0
    """How long to wait for every layer to report SERVING, seconds."""
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
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", os.path.abspath(self.run_dir))
        if self.device != "cpu":  # resolving a GPU imports torch: only when one is asked for
            object.__setattr__(self, "device", str(resolve_device(self.device)))

    def metrics_port(self, layer: str) -> int:
        """The /metrics port of ``layer`` (0: off)."""
        return self.metrics_port_base + LAYERS.index(layer) if self.metrics_port_base else 0
