"""A real Prometheus (Debian's package) scrapes a running stack under mixed load with a small KV
cache (so that the prefix cache hits, blocks are evicted and requests are preempted), and every
panel of the shipped Grafana board is queried through it. ``promtool check metrics`` lints each
layer's exposition.

Skipped, with the reason, where the ``prometheus`` and ``promtool`` binaries are missing
(``apt-get install prometheus``; ``.ci/run`` installs them)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e.stack import free_port, running_stack, text_stub

from zerolayer.stack.launcher import Stack
from zerolayer.v1 import generation_pb2 as pb

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="Prometheus is not installed (Debian: apt-get install prometheus); "
        "the board's queries were not checked",
    ),
]

REPO = Path(__file__).resolve().parents[2]
BOARD = REPO / "deploy" / "grafana" / "zerolayer-dashboard.json"
LAYERS = ("loader", "kvstore", "scheduler", "frontend")
SCRAPE_INTERVAL_S = 1
RATE_WINDOW = "20s"
"""What the board's ``$__rate_interval`` stands for here (Grafana: at least 4 scrape intervals)."""
GPU_ONLY = ("zerolayer_gpu_",)
"""Metrics only a CUDA scheduler exports (NVML): their panels have no data on this machine."""


def metrics_text(stack: Stack, layer: str) -> str:
    port = stack.config.metrics_port(layer)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


class Prometheus:
    """A Prometheus server scraping the stack's four endpoints every second."""

    def __init__(self, stack: Stack, work_dir: Path) -> None:
        self.port = free_port()
        config = work_dir / "prometheus.yml"
        jobs = "".join(
            f"  - job_name: zerolayer-{layer}\n"
            f"    static_configs:\n"
            f"      - targets: ['127.0.0.1:{stack.config.metrics_port(layer)}']\n"
            f"        labels: {{layer: {layer}}}\n"
            for layer in LAYERS
        )
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
            f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\nscrape_configs:\n{jobs}"
        )
        self.log = (work_dir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "prometheus exited; see prometheus.log"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def query(self, expr: str) -> list[dict]:
        """The instant vector (or scalar, as one sample) of ``expr`` now."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def targets_up(self) -> dict[str, float]:
        return {r["metric"]["layer"]: float(r["value"][1]) for r in self.query("up")}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


def mixed_load(stack: Stack, seconds: float) -> dict[str, int]:
    """Streams and unary calls from 8 threads for ``seconds``: a shared system prompt (prefix-cache
    hits), stop strings, client cancels and deadlines that expire. Returns counts by outcome."""
    stub = text_stub(stack)
    system = "You are a helpful assistant who answers briefly. " * 2
    counts: dict[str, int] = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def count(outcome: str) -> None:
        with lock:
            counts[outcome] = counts.get(outcome, 0) + 1

    def worker(index: int) -> None:
        i = 0
        while time.monotonic() < end:
            i += 1
            prompt = f"{system}Question {index}.{i}: tell a story."
            kind = (index + i) % 5
            try:
                if kind == 0:
                    stub.Generate(pb.GenerateRequest(prompt=prompt, max_new_tokens=24), timeout=30)
                elif kind == 1:
                    # long enough that the running requests outgrow the pool: preemptions
                    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=240, ignore_eos=True)
                    for _ in stub.GenerateStream(request, timeout=30):
                        pass
                elif kind == 2:
                    request = pb.GenerateRequest(
                        prompt=prompt, max_new_tokens=48, ignore_eos=True, stop=["e"]
                    )
                    stub.Generate(request, timeout=30)
                elif kind == 3:
                    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=400, ignore_eos=True)
                    stub.Generate(request, timeout=0.05)
                else:
                    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=200, ignore_eos=True)
                    call = stub.GenerateStream(request, timeout=30)
                    next(call)
                    call.cancel()
                count("ok")
            except grpc.RpcError as exc:
                count(exc.code().name)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


@pytest.fixture(scope="module")
def scraped(
    dummy_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, Prometheus, dict[str, int]]]:
    """A stack with a ~50-block KV cache, scraped by Prometheus while it served mixed load."""
    with running_stack(
        dummy_model_dir,
        tmp_path_factory.mktemp("logs"),
        metrics_port_base=free_port(),
        kv_cache_bytes=3 * 1024 * 1024 // 2,
    ) as stack:
        prometheus = Prometheus(stack, tmp_path_factory.mktemp("prometheus"))
        try:
            outcomes = mixed_load(stack, 7)
            time.sleep(3 * SCRAPE_INTERVAL_S)  # the last scrapes after the load
            yield stack, prometheus, outcomes
        finally:
            prometheus.stop()


def board_queries() -> list[tuple[str, str, str]]:
    """(panel title, unit, expr) of every query on the Grafana board."""
    board = json.loads(BOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            out.append((panel["title"], unit, target["expr"]))
    return out


def test_every_layer_is_scraped(scraped) -> None:
    _, prometheus, _ = scraped
    assert prometheus.targets_up() == dict.fromkeys(LAYERS, 1.0)


@pytest.mark.parametrize("layer", LAYERS)
def test_promtool_finds_nothing_to_lint_in_any_endpoint(scraped, layer: str) -> None:
    stack, _, _ = scraped
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=metrics_text(stack, layer),
        capture_output=True,
        text=True,
        timeout=30,
    )
    problems = result.stdout + result.stderr
    assert result.returncode == 0 and not problems, problems


def test_every_panel_of_the_board_has_plausible_data(scraped) -> None:
    _, prometheus, _ = scraped
    empty, implausible = [], []
    for title, unit, expr in board_queries():
        if any(name in expr for name in GPU_ONLY):
            continue  # no GPU here: these panels stay empty (docs/gpu-health.md)
        samples = prometheus.query(expr.replace("$__rate_interval", RATE_WINDOW))
        values = [float(s["value"][1]) for s in samples]
        # NaN: a quantile or ratio of no observations in the window
        if not values or all(math.isnan(v) for v in values):
            empty.append(f"{title}: {expr}")
            continue
        for v in values:
            if math.isinf(v) or v < 0 or (unit == "percentunit" and not 0 <= v <= 1):
                implausible.append(f"{title}: {expr} = {v}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not implausible, "\n".join(implausible)


def value(prometheus: Prometheus, expr: str) -> float:
    [sample] = prometheus.query(expr)
    return float(sample["value"][1])


def test_the_block_states_partition_the_pool(scraped) -> None:
    _, prometheus, _ = scraped
    capacity = value(prometheus, "zerolayer_kv_blocks_capacity")
    assert 20 <= capacity <= 100  # the small cache this module asked for
    # every sample of the load, not only the last one
    gap = "sum(zerolayer_kv_blocks) - sum(zerolayer_kv_blocks_capacity)"
    assert value(prometheus, gap) == 0
    assert value(prometheus, f"max_over_time(({gap})[1m:1s])") == 0
    assert value(prometheus, f"min_over_time(({gap})[1m:1s])") == 0


def test_the_prefix_cache_counts_each_request_at_most_once(scraped) -> None:
    # The cache was full at times (requests waited for blocks and were preempted): lookups
    # repeated at every engine step, and recomputes, must not count again.
    _, prometheus, outcomes = scraped
    sent = sum(outcomes.values())
    assert value(prometheus, "zerolayer_scheduler_preemptions_total") > 0
    queries = value(prometheus, "zerolayer_kv_prefix_queries_total")
    assert 0 < queries <= sent
    hit_ratio = value(
        prometheus,
        "zerolayer_kv_prefix_hit_tokens_total / zerolayer_kv_prefix_query_tokens_total",
    )
    assert 0 < hit_ratio <= 1


def test_every_request_that_ended_is_timed_once_with_its_finish_reason(scraped) -> None:
    _, prometheus, outcomes = scraped
    ended = value(prometheus, "sum(zerolayer_scheduler_finished_requests_total)")
    assert value(prometheus, "zerolayer_scheduler_e2e_seconds_count") == ended
    # n = 1 each; a call whose deadline passed before it reached the scheduler is not there
    assert outcomes["ok"] <= ended <= sum(outcomes.values())
    assert value(prometheus, "zerolayer_scheduler_requests_running") == 0
    reasons = {
        s["metric"]["finish_reason"]
        for s in prometheus.query("zerolayer_scheduler_finished_requests_total > 0")
    }
    assert {"LENGTH", "ABORT"} <= reasons


def test_the_docs_name_every_metric_the_layers_export(scraped) -> None:
    stack, _, _ = scraped
    doc = (REPO / "docs" / "observability.md").read_text()
    table = doc[doc.index("## Metrics\n") : doc.index("Latency histograms have buckets")]
    shorthands = set(re.findall(r"`(_\w+)`", table))
    missing = []
    for layer in LAYERS:
        for name in re.findall(r"^# TYPE (zerolayer_\w+) ", metrics_text(stack, layer), re.M):
            if name.endswith("_created"):
                continue  # prometheus-client's creation time of a counter or histogram
            if name not in table and not any(name.endswith(s) for s in shorthands):
                missing.append(name)
    assert not missing, missing
