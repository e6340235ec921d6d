"""A stack with two schedulers on one kvstore, each layer a process started here (the launcher
runs one scheduler; its command lines are reused, with a second scheduler's address added)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import grpc
from e2e.stack import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerolayer.common.server import LAUNCHER_PID_ENV
from zerolayer.kv.arena_file import sidecar_path
from zerolayer.stack.launcher import Stack, StackConfig
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc

SCHEDULERS = ("scheduler-a", "scheduler-b")
SERVING = health_pb2.HealthCheckResponse.SERVING
HUNG_AFTER_S = 2.0
"""The frontend's ``--scheduler-hung-after-s`` here (default 5): a scheduler stopped with SIGSTOP
is found hung sooner; its pings are answered by gRPC's core threads even when it is busy."""


def _replace_flag(command: list[str], flag: str, value: str) -> list[str]:
    i = command.index(flag)
    return [*command[: i + 1], value, *command[i + 2 :]]


class TwoSchedulers:
    """loader, kvstore, ``scheduler-a``, ``scheduler-b`` and a frontend that routes to both."""

    def __init__(
        self, model_dir: Path, run_dir: Path, failover_wait_s: float = 30.0, routing: str = ""
    ) -> None:
        # NOTE: run_dir is short (unix socket paths are limited to 108 bytes).
        config = StackConfig(
            model_dir=str(model_dir),
            run_dir=str(run_dir),
            listen=f"127.0.0.1:{free_port()}",
            kv_cache_bytes=16 * 1024 * 1024,
        )
        self.stack = Stack(config)
        self.listen = config.listen
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir()
        self.addresses = {name: f"unix:{run_dir / f'{name}.sock'}" for name in SCHEDULERS}
        self.addresses |= {layer: self.stack.address(layer) for layer in ("loader", "kvstore")}
        frontend = _replace_flag(
            self.stack.command("frontend"),
            "--scheduler",
            ",".join(self.addresses[name] for name in SCHEDULERS),
        )
        self.commands = {
            "loader": self.stack.command("loader"),
            "kvstore": self.stack.command("kvstore"),
            **{
                name: _replace_flag(
                    self.stack.command("scheduler"), "--address", self.addresses[name]
                )
                for name in SCHEDULERS
            },
            "frontend": [
                *frontend,
                "--failover-wait-s",
                str(failover_wait_s),
                "--scheduler-hung-after-s",
                str(HUNG_AFTER_S),
                *(["--routing", routing] if routing else []),
            ],
        }
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        """Starts (or restarts) one process and waits until it reports SERVING."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                self.commands[name],
                stdin=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())},
            )
        address = self.listen if name == "frontend" else self.addresses[name]
        service = f"zerolayer.instance.{self.stack.instance_id}" if name == "frontend" else ""
        self.wait_health(address, service, SERVING, 90.0, name)

    def wait_health(
        self, address: str, service: str, status: int, timeout_s: float, name: str = ""
    ) -> None:
        """Polls ``service`` on ``address`` until it reports ``status``."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    got = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                    if got.status == status:
                        return
                except grpc.RpcError:
                    pass
                process = self.processes.get(name)
                if process is not None and process.poll() is not None:
                    raise AssertionError(f"{name} exited: {self.log_tail(name)}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{address} {service!r} not {status}: {self.log_tail(name)}"
                    )
                time.sleep(0.05)

    def public_health(self) -> int:
        """The frontend's public health ("")."""
        with grpc.insecure_channel(self.listen) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status

    def stats(self, name: str) -> scheduler_pb2.SchedulerStats:
        """Scheduler ``name``'s counters (all 0 if it cannot be reached)."""
        with grpc.insecure_channel(self.addresses[name]) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                return stub.GetStats(scheduler_pb2.SchedulerStatsRequest(), timeout=2)
            except grpc.RpcError:
                return scheduler_pb2.SchedulerStats()

    def num_running(self, name: str) -> int:
        """Requests running in scheduler ``name`` (0 if it cannot be reached)."""
        return self.stats(name).num_running

    def carrier(self, timeout_s: float = 30.0, exclude: str = "") -> str:
        """The scheduler that runs a request now (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in SCHEDULERS:
                if name != exclude and self.num_running(name) > 0:
                    return name
            time.sleep(0.005)
        raise AssertionError("no scheduler runs the request")

    def kill(self, name: str) -> None:
        """SIGKILL: no chance to free anything or say goodbye."""
        self.processes[name].kill()
        self.processes[name].wait()

    def log_tail(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        """Stops every process (frontend first)."""
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for path in (self.stack.shm_path, sidecar_path(self.stack.shm_path)):
            Path(path).unlink(missing_ok=True)  # the arena and its sidecar, as Stack.stop does


def start_two_schedulers(model_dir: Path, run_dir: Path, routing: str = "") -> TwoSchedulers:
    """Starts every layer, both schedulers before the frontend (``routing``: its ``--routing``,
    "" for the default)."""
    cluster = TwoSchedulers(model_dir, run_dir, routing=routing)
    try:
        for name in ("loader", "kvstore", *SCHEDULERS, "frontend"):
            cluster.start(name)
    except BaseException:
        cluster.stop()
        raise
    return cluster
