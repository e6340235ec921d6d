"""How to run the four layers of one deployment: the launcher's frozen configuration."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from zerolayer.common.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BYTES, DEFAULT_LISTEN
from zerolayer.common.device import resolve_device

LAYERS = ("loader", "kvstore", "scheduler", "frontend")

SHM_DIR = "/dev/shm"
"""Where ``zerolayer up`` creates the KV arena file (``<SHM_DIR>/<instance id>.kv``, see
``zerolayer.stack.launcher.stack_instance_id``)."""


@dataclass(frozen=True)
class StackConfig:
    """How to run the four layers."""

    model_dir: str
    """Hugging Face model directory to serve."""
    listen: str = DEFAULT_LISTEN
    """Public address of the frontend."""
    run_dir: str | None = None
    """Directory for the internal unix sockets; None: a new private (0700) temporary directory.
    A relative one is made absolute against the current directory at construction, so the
    pre-flight check, the launcher and the layers (which run elsewhere) name the same one."""
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    """Size of the KV arena in bytes."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Tokens per KV block."""
    max_num_seqs: int = 64
    """Running-set limit of the scheduler."""
    max_num_batched_tokens: int = 512
    """Token budget of one scheduler step."""
    num_threads: int = 0
    """torch threads of the scheduler; 0: every core but one (see ``default_num_threads``)."""
    kv_unavailable_timeout_s: float = 30.0
    """How long the scheduler's requests that need KV blocks wait for an unusable kvstore
    before they end with UNAVAILABLE (``--kv-unavailable-timeout-s``), seconds."""
    log_dir: str | None = None
    """Write each layer's stderr to ``<log_dir>/<layer>.log``; None: inherit this process's."""
    startup_timeout_s: float = 180.0
    """How long to wait for every layer to report SERVING."""
    enable_prefix_caching: bool = True
    """Passed to the kvstore (``--no-prefix-caching`` when False)."""
    supervise: bool = True
    """Restart a layer that exits or is killed (with backoff) while the others keep running."""
    max_restart_backoff_s: float = 10.0
    """Longest wait before restarting a layer that keeps dying."""
    metrics_port_base: int = 0
    """Prometheus ports: loader +0, kvstore +1, scheduler +2, frontend +3; 0: no endpoints."""
    nvml_script: str = ""
    """Test only: the scheduler's ``--nvml-script`` (GPU events and samples from a JSON-lines
    file instead of NVML); empty: off."""
    device: str = "cpu"
    """``--device`` of the loader, kvstore and scheduler ("cpu", "cuda", "cuda:N", "auto")."""

    def __post_init__(self) -> None:
        """Checks the settings before any process starts.

        Raises:
            ValueError: a setting is out of range; the message starts with its flag.
        """
        host, _, port = self.listen.rpartition(":")
        # NOTE: str.isdigit also accepts digits int() refuses ("²"); ports are ASCII digits.
        if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"--listen: {self.listen!r} is not HOST:PORT with a port in 1..65535")
        _check_listen_host(host, self.listen)
        for name in ("kv_cache_bytes", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be > 0")
        if not self.kv_unavailable_timeout_s > 0:
            raise ValueError("--kv-unavailable-timeout-s: must be > 0")
        if self.num_threads < 0:
            raise ValueError("--num-threads: must be >= 0 (0: every core but one)")
        if self.metrics_port_base and not 1 <= self.metrics_port_base <= 65532:
            raise ValueError("--metrics-port-base: must be in 1..65532 (or 0: off)")
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", os.path.abspath(self.run_dir))
        if self.device != "cpu":  # resolving a GPU imports torch: only when one is asked for
            object.__setattr__(self, "device", str(resolve_device(self.device)))

    def metrics_port(self, layer: str) -> int:
        """The /metrics port of ``layer`` (0: off)."""
        return self.metrics_port_base + LAYERS.index(layer) if self.metrics_port_base else 0


def _check_listen_host(host: str, listen: str) -> None:
    """Refuses hosts gRPC cannot bind though a resolver might take them: an IPv6 address without
    brackets, or an IPv4 address that is not a full dotted quad (``127.1``, ``[127.0.0.1]``).

    Raises:
        ValueError: naming ``--listen``.
    """
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"--listen: {listen!r}: brackets hold an IPv6 address") from None
        return
    if ":" in host:
        raise ValueError(f"--listen: {listen!r}: an IPv6 address goes in brackets, [{host}]:PORT")
    if host.replace(".", "").isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f"--listen: {listen!r}: an IPv4 address needs four dotted numbers"
            ) from None
