"""Two nodes on one machine behind an existing load balancer: two whole stacks (``zerolayer up``
each, own run directory and public port) behind HAProxy running the shipped
``deploy/haproxy/haproxy.cfg`` as a gRPC (h2c) balancer that checks each node's public gRPC health.

Checks: calls spread over both nodes (per call by the balancer's ``x-zerolayer-node`` header, per
node by each frontend's ``zerolayer_frontend_requests_total``); the check is a real gRPC health
check (a port that answers NOT_SERVING is taken out); a scheduler killed in a node with two is
not seen by the balancer (node1), while a node whose only scheduler is killed (node0) is taken
out within ``inter + (fall - 1) * fastinter`` and back once restarted, its streams unharmed;
``kill -9`` of one whole node (its supervisor and its layers) fails only the streams that node
carried, and the balancer takes the node out within the same bound.

Skipped, with the reason, where the ``haproxy`` binary is missing (Debian: ``apt-get install
haproxy``; ``.ci/run`` installs it)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import grpc
import pytest
from e2e.stack import free_port
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("haproxy") is None,
        reason="HAProxy is not installed (Debian: apt-get install haproxy); the two nodes behind "
        "a load balancer were not checked",
    ),
]

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
NODES = ("node0", "node1")
NODE_HEADER = "x-zerolayer-node"
FAILED_STREAM_CODES = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
}
"""What a client sees of a stream whose node died under it: HAProxy 2.6 ends the stream without
gRPC trailers (UNKNOWN, "Stream removed"), or resets it (INTERNAL), or the connection goes
(UNAVAILABLE). Never OK: a cut stream is not mistaken for a finished one."""


def check_timing() -> tuple[float, float, int]:
    """``inter`` and ``fastinter`` (seconds) and ``fall`` of the shipped config's health check:
    a node that dies is out after at most ``inter + (fall - 1) * fastinter`` (the next check,
    then ``fall - 1`` more at the fast interval), plus the checks' own time."""
    line = re.search(r"^\s*default-server check .*$", HAPROXY_CFG.read_text(), re.MULTILINE)
    assert line, "no `default-server check ...` line"

    def seconds(name: str) -> float:
        found = re.search(rf"\b{name} (\d+)(ms|s)\b", line[0])
        assert found, name
        return int(found[1]) / (1000 if found[2] == "ms" else 1)

    fall = re.search(r"\bfall (\d+)\b", line[0])
    assert fall, "fall"
    return seconds("inter"), seconds("fastinter"), int(fall[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@dataclass
class Node:
    """One ``zerolayer up`` (supervisor and four layers) on its own port and run directory."""

    name: str
    listen: str
    metrics_port_base: int
    process: subprocess.Popen

    def frontend_requests(self) -> float:
        """``zerolayer_frontend_requests_total`` of GenerateStream and Generate, all codes."""
        url = f"http://127.0.0.1:{self.metrics_port_base + 3}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("zerolayer_frontend_requests_total{")
            and re.search(r'method="(Generate|GenerateStream)"', line)
        )

    def kill_9(self) -> None:
        """SIGKILL to the supervisor and every layer at once: the node is gone."""
        pids = [self.process.pid, *descendants(self.process.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)


def start_node(name: str, model_dir: Path, work_dir: Path, base: int, *extra: str) -> Node:
    """Starts ``zerolayer up`` with its metrics ports from ``base`` on (one per process)."""
    run_dir = work_dir / f"{name}-run"
    run_dir.mkdir(mode=0o700)
    listen = f"127.0.0.1:{free_port()}"
    with (work_dir / f"{name}.log").open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "zerolayer"),
                "up",
                "--model",
                str(model_dir),
                "--listen",
                listen,
                "--run-dir",
                str(run_dir),
                "--kv-cache-bytes",
                "16M",
                "--metrics-port-base",
                str(base),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # like a node: no signal of this test's terminal reaches it
        )
    return Node(name, listen, base, process)


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive free TCP ports on 127.0.0.1."""
    for _ in range(50):
        base = free_port()
        if base + n < 65536 and all(port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_serving(node: Node, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(node.listen) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert node.process.poll() is None, f"{node.name} exited; see {node.name}.log"
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{node.name} not SERVING within {timeout_s} s")


@dataclass
class HAProxy:
    """HAProxy on the shipped config (addresses from its environment variables), plus an admin
    socket (a second config file) for reading the servers' check state."""

    listen: str
    admin_socket: Path
    process: subprocess.Popen
    log_path: Path
    log: BinaryIO

    @classmethod
    def start(cls, work_dir: Path, node_addresses: dict[str, str]) -> HAProxy:
        admin_socket = work_dir / "haproxy-admin.sock"
        extra = work_dir / "admin.cfg"
        extra.write_text(f"global\n    stats socket {admin_socket} level admin\n")
        listen = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "ZEROLAYER_LB_LISTEN": listen}
        env |= {f"ZEROLAYER_{name.upper()}": address for name, address in node_addresses.items()}
        log_path = work_dir / "haproxy.log"
        log = log_path.open("wb")
        process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(HAPROXY_CFG), "-f", str(extra)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        proxy = cls(listen, admin_socket, process, log_path, log)
        deadline = time.monotonic() + 10
        while not admin_socket.exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)
        return proxy

    def admin(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.admin_socket))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_status(self) -> dict[str, str]:
        """Each server's check status ("UP", "DOWN", "UP 1/2" ...) by name."""
        lines = self.admin("show stat").splitlines()
        header = lines[0].removeprefix("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]: row["status"]
            for row in rows
            if row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_status(self, wanted: dict[str, str], timeout_s: float) -> float:
        """Seconds until every server in ``wanted`` has its status."""
        start = time.monotonic()
        while True:
            status = self.server_status()
            if all(status.get(name) == want for name, want in wanted.items()):
                return time.monotonic() - start
            assert time.monotonic() - start < timeout_s, (status, self.log_path.read_text())
            time.sleep(0.02)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def nodes(
    dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Node]]:
    model_dir = dummy_model_dir
    work_dir = tmp_path_factory.mktemp("nodes")
    base = free_port_block(16)  # 8 metrics ports per node
    started = {  # in parallel; node1 with two schedulers, for the failover inside a node
        "node0": start_node("node0", model_dir, work_dir, base),
        "node1": start_node("node1", model_dir, work_dir, base + 8, "--schedulers", "2"),
    }
    try:
        for node in started.values():
            wait_serving(node)
        yield started
    finally:
        for node in started.values():
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGINT)  # `zerolayer up` stops its layers
        for node in started.values():
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                node.kill_9()


@pytest.fixture(scope="module")
def balancer(nodes: dict[str, Node], tmp_path_factory: pytest.TempPathFactory) -> Iterator[HAProxy]:
    work_dir = tmp_path_factory.mktemp("haproxy")
    proxy = HAProxy.start(work_dir, {name: node.listen for name, node in nodes.items()})
    try:
        proxy.wait_status(dict.fromkeys(NODES, "UP"), timeout_s=10)
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def stub(balancer: HAProxy) -> Iterator[generation_pb2_grpc.TextGenerationStub]:
    with grpc.insecure_channel(balancer.listen) as channel:
        yield generation_pb2_grpc.TextGenerationStub(channel)


def request(max_new_tokens: int, prompt: int = 1) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=[prompt, 2, 3, 4]),
        max_new_tokens=max_new_tokens,
        ignore_eos=True,
    )


def generate(stub: generation_pb2_grpc.TextGenerationStub, prompt: int) -> str:
    """One unary Generate through the balancer; the node that served it."""
    response, call = stub.Generate.with_call(request(4, prompt), timeout=30)
    assert len(response.token_ids) == 4
    return dict(call.initial_metadata())[NODE_HEADER]


def test_calls_of_one_client_spread_over_both_nodes(
    nodes: dict[str, Node], stub: generation_pb2_grpc.TextGenerationStub
) -> None:
    before = {name: node.frontend_requests() for name, node in nodes.items()}
    with ThreadPoolExecutor(4) as pool:  # one channel, one HTTP/2 connection, concurrent calls
        served = list(pool.map(lambda i: generate(stub, i), range(12)))
    counts = {name: served.count(name) for name in NODES}
    assert sum(counts.values()) == 12
    # leastconn: each call to the node with the fewest in flight, so the faster node (node1, two
    # schedulers) may take more; both take some.
    assert min(counts.values()) >= 1, counts
    # The balancer's header names the node whose frontend really counted the call.
    after = {name: node.frontend_requests() for name, node in nodes.items()}
    assert {name: after[name] - before[name] for name in NODES} == counts


async def serve_health(port: int, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    await servicer.set("", status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def test_the_check_is_the_grpc_health_not_a_tcp_connect(tmp_path: Path) -> None:
    # Two bare grpc.health.v1 servers stand in for a stack that serves and one whose port is open
    # while no scheduler takes requests (starting, or its schedulers all down): a TCP check would
    # pass both.
    ports = {"node0": free_port(), "node1": free_port()}
    statuses = {
        "node0": health_pb2.HealthCheckResponse.SERVING,
        "node1": health_pb2.HealthCheckResponse.NOT_SERVING,
    }
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = [
        asyncio.run_coroutine_threadsafe(serve_health(ports[name], statuses[name]), loop)
        for name in NODES
    ]
    proxy = HAProxy.start(tmp_path, {name: f"127.0.0.1:{port}" for name, port in ports.items()})
    try:
        proxy.wait_status({"node0": "UP", "node1": "DOWN"}, timeout_s=10)
        time.sleep(2)  # and it stays so
        assert proxy.server_status() == {"node0": "UP", "node1": "DOWN"}
    finally:
        proxy.stop()
        for server in servers:
            server.cancel()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@dataclass
class Stream:
    node: str | None = None
    tokens: int = 0
    code: grpc.StatusCode | None = None
    details: str = ""


STREAM_TOKENS = 300
"""About 2 s of tokens per stream here: still running when the test kills something."""


class Streams:
    """``count`` GenerateStream calls through the balancer, each in a thread; the constructor
    returns once every one has produced tokens."""

    def __init__(self, stub: generation_pb2_grpc.TextGenerationStub, count: int) -> None:
        self.streams = [Stream() for _ in range(count)]
        self._started = threading.Barrier(count + 1)
        self._threads = [threading.Thread(target=self._run, args=(stub, i)) for i in range(count)]
        for thread in self._threads:
            thread.start()
        self._started.wait(60)

    def _run(self, stub: generation_pb2_grpc.TextGenerationStub, i: int) -> None:
        call = stub.GenerateStream(request(STREAM_TOKENS, prompt=10 + i), timeout=120)
        stream = self.streams[i]
        stream.node = dict(call.initial_metadata()).get(NODE_HEADER)
        waited = False
        try:
            for part in call:
                stream.tokens += len(part.token_ids)
                if stream.tokens >= 8 and not waited:
                    waited = True
                    self._started.wait(60)
            stream.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            stream.code, stream.details = exc.code(), exc.details()

    def carried(self) -> dict[str, list[Stream]]:
        return {name: [s for s in self.streams if s.node == name] for name in NODES}

    def join(self) -> None:
        for thread in self._threads:
            thread.join(120)
            assert not thread.is_alive()


def scheduler_pid(node: Node) -> int:
    """The pid of the node's first scheduler (``scheduler.sock``)."""
    for pid in descendants(node.process.pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"zerolayer.scheduler" in args and any(a.endswith(b"/scheduler.sock") for a in args):
            return pid
    raise LookupError(f"no scheduler under {node.name}")


class StatusTimeline:
    """Polls the balancer's server statuses every 20 ms from a thread: each change, timed from
    the start."""

    def __init__(self, proxy: HAProxy) -> None:
        self.start = time.monotonic()
        self.changes: list[tuple[float, str, str]] = []
        """(seconds, server, new status), in order."""
        self._proxy = proxy
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        last: dict[str, str] = {}
        while True:
            done = self._done.is_set()  # one more poll after stop(): what the caller saw
            now = time.monotonic() - self.start
            for name, status in self._proxy.server_status().items():
                if last.get(name) != status:
                    self.changes.append((now, name, status))
                    last[name] = status
            if done:
                return
            time.sleep(0.02)

    def first(self, name: str, status: str, after: float = 0.0) -> float | None:
        """When ``name`` first had ``status``, from ``after`` on (None: not yet)."""
        found = (t for t, n, s in self.changes if n == name and s == status and t >= after)
        return next(found, None)

    def statuses(self, name: str) -> set[str]:
        return {s for _, n, s in self.changes if n == name}

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)


def out_within_s() -> float:
    """The most seconds the balancer takes to mark a failed node DOWN: the next check
    (``inter``), then ``fall - 1`` more at ``fastinter``."""
    inter_s, fastinter_s, fall = check_timing()
    return inter_s + (fall - 1) * fastinter_s


def kill_a_scheduler_under_streams(
    stub: generation_pb2_grpc.TextGenerationStub, balancer: HAProxy, node: Node
) -> tuple[Streams, StatusTimeline]:
    """Runs 8 streams through the balancer, SIGKILLs ``node``'s first scheduler while they run
    (with at least 2 of them on ``node``), and waits for the streams to end; the balancer's
    statuses are watched from just before the kill (the caller stops the timeline)."""
    streams = Streams(stub, 8)
    assert len(streams.carried()[node.name]) >= 2, streams.carried()
    timeline = StatusTimeline(balancer)
    os.kill(scheduler_pid(node), signal.SIGKILL)
    streams.join()
    assert all(
        s.code == grpc.StatusCode.OK and s.tokens == STREAM_TOKENS for s in streams.streams
    ), streams.streams
    return streams, timeline


def test_a_scheduler_dying_inside_a_node_is_not_the_balancers_business(
    nodes: dict[str, Node], balancer: HAProxy, stub: generation_pb2_grpc.TextGenerationStub
) -> None:
    # node1 runs two schedulers: its frontend moves the streams of the one killed to the other,
    # and its public health stays SERVING, so the balancer keeps it in and no client sees it.
    _, timeline = kill_a_scheduler_under_streams(stub, balancer, nodes["node1"])
    time.sleep(out_within_s())  # and the checks after the streams ended
    timeline.stop()
    assert timeline.statuses("node1") == {"UP"}, timeline.changes
    # Its supervisor restarted the scheduler: node1 is whole again for the next tests.
    wait_serving(nodes["node1"])


def test_a_node_whose_only_scheduler_dies_is_out_until_the_scheduler_is_back(
    nodes: dict[str, Node], balancer: HAProxy, stub: generation_pb2_grpc.TextGenerationStub
) -> None:
    # node0 runs one scheduler: while its supervisor restarts it the node is NOT_SERVING, and the
    # balancer takes it out, and back in once it serves again. Its streams wait on its frontend
    # for the restarted scheduler (--failover-wait-s) and go on.
    streams, timeline = kill_a_scheduler_under_streams(stub, balancer, nodes["node0"])
    balancer.wait_status({"node0": "UP"}, timeout_s=30)
    timeline.stop()
    down_s = timeline.first("node0", "DOWN")
    assert down_s is not None and down_s < out_within_s() + 0.5, timeline.changes
    up_s = timeline.first("node0", "UP", after=down_s)
    assert up_s is not None, timeline.changes
    assert timeline.statuses("node1") == {"UP"}, timeline.changes
    print(
        f"\nkill -9 of node0's only scheduler: DOWN {down_s:.2f} s after, UP again at "
        f"{up_s:.2f} s; all {len(streams.streams)} streams OK"
    )


def test_kill_9_of_one_node_fails_only_its_streams_and_the_balancer_drops_it_in_time(
    nodes: dict[str, Node], balancer: HAProxy, stub: generation_pb2_grpc.TextGenerationStub
) -> None:
    inter_s, fastinter_s, fall = check_timing()
    # NOTE: last in this module: node0 stays dead.
    streams = Streams(stub, 8)
    carried = {name: len(on) for name, on in streams.carried().items()}
    assert min(carried.values()) >= 2, carried

    timeline = StatusTimeline(balancer)
    killed_at = timeline.start
    nodes["node0"].kill_9()

    # New calls from the moment of the kill: which fail, until when.
    new_calls: list[tuple[float, str | grpc.StatusCode]] = []
    while time.monotonic() < killed_at + out_within_s() + 2:
        sent = time.monotonic() - killed_at
        try:
            new_calls.append((sent, generate(stub, 99)))
        except grpc.RpcError as exc:
            new_calls.append((sent, exc.code()))
    streams.join()
    timeline.stop()

    by_node = streams.carried()
    assert all(s.code == grpc.StatusCode.OK and s.tokens == STREAM_TOKENS for s in by_node["node1"])
    assert all(
        s.code in FAILED_STREAM_CODES and s.tokens < STREAM_TOKENS for s in by_node["node0"]
    ), by_node["node0"]
    # The balancer's check takes the node out in time (0.5 s: the checks' own time, scheduling).
    down_s = timeline.first("node0", "DOWN")
    assert down_s is not None and down_s < out_within_s() + 0.5, timeline.changes
    failed = [(t, result) for t, result in new_calls if not isinstance(result, str)]
    last_failure_s = max((t for t, _ in failed), default=0.0)
    # Once it is out, every new call succeeds, on node1. Before, `retries` and `option
    # redispatch` move a call whose connection node0 refuses to node1: at most the one call in
    # flight at the kill fails (without them, every call sent to node0 until it is out does).
    assert last_failure_s <= down_s, (failed, new_calls)
    assert all(result == "node1" for t, result in new_calls if t > down_s)
    assert len(failed) <= 1, failed
    print(
        f"\nkill -9 of node0: its {carried['node0']} of {len(streams.streams)} streams failed "
        f"({sorted({s.code.name for s in by_node['node0']})}); HAProxy marked it DOWN "
        f"{down_s:.2f} s after the kill (at most {out_within_s()} s: inter {inter_s} s, "
        f"fastinter {fastinter_s} s, fall {fall}); {len(failed)} of {len(new_calls)} new calls "
        f"failed" + (f", the last sent {last_failure_s:.2f} s after the kill" if failed else "")
    )
