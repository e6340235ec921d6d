"""Starts the four layers as separate processes, waits until each is healthy, and stops them.

The CLI's ``zerolayer up`` and the end-to-end tests use this same launcher.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import DEFAULT_BLOCK_SIZE, DEFAULT_KV_CACHE_BYTES, DEFAULT_LISTEN

log = logging.getLogger(__name__)

LAYERS = ("loader", "kvstore", "scheduler", "frontend")


@dataclass(frozen=True)
class StackConfig:
    """How to run the four layers."""

    model_dir: str
    """Hugging Face model directory to serve."""
    listen: str = DEFAULT_LISTEN
    """Public address of the frontend."""
    run_dir: str | None = None
    """Directory for the internal unix sockets; None: a new private (0700) temporary directory."""
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    """Size of the KV arena in bytes."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Tokens per KV block."""
    max_num_seqs: int = 64
    """Running-set limit of the scheduler."""
    max_num_batched_tokens: int = 512
    """Token budget of one scheduler step."""
    num_threads: int = 0
    """torch threads of the scheduler; 0: one per core."""
    log_dir: str | None = None
    """Write each layer's stderr to ``<log_dir>/<layer>.log``; None: inherit this process's."""
    startup_timeout_s: float = 180.0
    """How long to wait for every layer to report SERVING."""


class StackError(RuntimeError):
    """A layer failed to start or died."""


class Stack:
    """The four layer processes of one zerolayer deployment on this machine."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._owns_run_dir = config.run_dir is None
        self.run_dir = Path(config.run_dir or tempfile.mkdtemp(prefix="zerolayer-"))
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.shm_path = f"/dev/shm/{self.run_dir.name}.kv"
        self.processes: dict[str, subprocess.Popen] = {}

    def address(self, layer: str) -> str:
        """gRPC address of a layer (the frontend's public one, unix sockets for the others)."""
        if layer == "frontend":
            return self.config.listen
        return f"unix:{self.run_dir / f'{layer}.sock'}"

    def command(self, layer: str) -> list[str]:
        """The command line that runs ``layer`` alone."""
        c = self.config
        a = self.address
        args = {
            "loader": ["--address", a("loader"), "--model", c.model_dir],
            "kvstore": [
                "--address",
                a("kvstore"),
                "--loader",
                a("loader"),
                "--shm-path",
                self.shm_path,
                "--kv-cache-bytes",
                str(c.kv_cache_bytes),
                "--block-size",
                str(c.block_size),
            ],
            "scheduler": [
                "--address",
                a("scheduler"),
                "--loader",
                a("loader"),
                "--kvstore",
                a("kvstore"),
                "--max-num-seqs",
                str(c.max_num_seqs),
                "--max-num-batched-tokens",
                str(c.max_num_batched_tokens),
                "--num-threads",
                str(c.num_threads),
            ],
            "frontend": [
                "--listen",
                a("frontend"),
                "--loader",
                a("loader"),
                "--scheduler",
                a("scheduler"),
            ],
        }[layer]
        return [sys.executable, "-m", f"services.{layer}", *args]

    def start(self) -> None:
        """Starts all layers at once (each waits for the ones it needs) and waits until all are
        SERVING.

        Raises:
            StackError: a layer exited or was not healthy within ``startup_timeout_s``; every
                started layer is stopped again.
        """
        try:
            for layer in LAYERS:
                self.start_layer(layer)
            deadline = time.monotonic() + self.config.startup_timeout_s
            for layer in LAYERS:
                self.wait_healthy(layer, deadline)
        except BaseException:
            self.stop()
            raise

    def start_layer(self, layer: str) -> subprocess.Popen:
        """Starts one layer's process (replacing a dead one)."""
        stderr = None
        if self.config.log_dir is not None:
            Path(self.config.log_dir).mkdir(parents=True, exist_ok=True)
            stderr = open(Path(self.config.log_dir) / f"{layer}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            self.command(layer),
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            cwd=Path(__file__).resolve().parents[1],
        )
        if stderr is not None:
            stderr.close()
        self.processes[layer] = process
        return process

    def wait_healthy(self, layer: str, deadline: float) -> None:
        """Polls the layer's gRPC health service until SERVING.

        Raises:
            StackError: the process exited or the deadline passed.
        """
        target = self.address(layer)
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                process = self.processes[layer]
                if process.poll() is not None:
                    raise StackError(
                        f"{layer} exited with code {process.returncode}{self._log_tail(layer)}"
                    )
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(f"{layer} not healthy in time{self._log_tail(layer)}")
                time.sleep(0.05)

    def _log_tail(self, layer: str) -> str:
        if self.config.log_dir is None:
            return ""
        path = Path(self.config.log_dir) / f"{layer}.log"
        if not path.exists():
            return ""
        return "\n--- " + str(path) + " ---\n" + path.read_text(errors="replace")[-3000:]

    def stop_layer(self, layer: str, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        process = self.processes.get(layer)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stops every layer (frontend first) and removes the sockets and the shared memory."""
        for layer in reversed(LAYERS):
            self.stop_layer(layer)
        if os.path.exists(self.shm_path):
            os.unlink(self.shm_path)
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            for layer in LAYERS[:3]:
                Path(self.address(layer).removeprefix("unix:")).unlink(missing_ok=True)

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
