"""The line ``zerolayer up`` prints on stderr once its stack serves: every address it serves on."""

from __future__ import annotations

from pathlib import Path

from zerolayer.stack.config import StackConfig


def serving_line(config: StackConfig, run_dir: Path) -> str:
    """``zerolayer: serving gRPC on 127.0.0.1:50051, HTTP on http://127.0.0.1:8000, metrics on
    127.0.0.1:9200 (loader), :9201 (kvstore), :9202 (scheduler), :9203 (frontend); internal
    sockets in /tmp/zerolayer-...``, with HTTP and the metrics only where they are on."""
    served = [f"gRPC on {config.listen}"]
    if config.http_listen:
        served.append(f"HTTP on {'https' if config.tls else 'http'}://{config.http_listen}")
    if config.metrics_port_base:
        host = config.metrics_host.strip("[]")
        by_port = sorted((config.metrics_port(slot.name), slot.name) for slot in config.slots)
        ports = [f":{port} ({name})" for port, name in by_port]
        served.append(f"metrics on {f'[{host}]' if ':' in host else host}{', '.join(ports)}")
    return f"zerolayer: serving {', '.join(served)}; internal sockets in {run_dir}"
