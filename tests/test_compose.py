"""compose.yaml, Dockerfile, deploy/prometheus.yml and the Grafana dashboard, checked without
Docker: every layer command parses with the real CLI, the addresses, volumes, ports and metrics
targets agree, and the dashboard queries only metric names the layers export."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import zerolayer
from zerolayer.cli.main import build_parser
from zerolayer.common.setting import Setting
from zerolayer.common.settings import layer_settings
from zerolayer.scheduler.model import kernels
from zerolayer.scheduler.model.native import build as native_build
from zerolayer.stack.launcher import LAYERS, Stack, StackConfig

ROOT = Path(__file__).resolve().parents[1]
METRICS_PORT_BASE = 9101
"""compose.yaml's metrics ports are the launcher's ``--metrics-port-base 9101`` layout."""

HISTOGRAMS = {
    "zerolayer_scheduler_ttft_seconds",
    "zerolayer_scheduler_itl_seconds",
    "zerolayer_scheduler_e2e_seconds",
    "zerolayer_scheduler_queue_seconds",
    "zerolayer_scheduler_step_gap_seconds",
    "zerolayer_scheduler_prompt_length_tokens",
    "zerolayer_scheduler_generation_length_tokens",
    "zerolayer_frontend_ttft_seconds",
}
COUNTERS = {
    "zerolayer_scheduler_generated_tokens_total",
    "zerolayer_scheduler_preemptions_total",
    "zerolayer_scheduler_page_faults_total",
    "zerolayer_scheduler_prompt_tokens_total",
    "zerolayer_scheduler_cached_prompt_tokens_total",
    "zerolayer_scheduler_finished_requests_total",
    "zerolayer_frontend_requests_total",
    "zerolayer_kv_evictions_total",
    "zerolayer_kv_prefix_hit_tokens_total",
    "zerolayer_kv_prefix_query_tokens_total",
}
GAUGES = {
    "zerolayer_scheduler_requests_running",
    "zerolayer_scheduler_requests_waiting",
    "zerolayer_scheduler_kv_blocks_held",
    "zerolayer_scheduler_kv_cache_utilization",
    "zerolayer_scheduler_max_num_seqs",
    "zerolayer_scheduler_serving",
    "zerolayer_scheduler_model_info",
    "zerolayer_frontend_requests_in_flight",
    "zerolayer_frontend_serving",
    "zerolayer_loader_serving",
    "zerolayer_kv_serving",
    "zerolayer_gpu_sm_utilization_stability",
    "zerolayer_kv_blocks",
    "zerolayer_loader_resident_bytes",
    "zerolayer_loader_weight_bytes",
}
"""The metric names the layers export (a histogram as its base name)."""

DEPENDENCY_SETTINGS = {
    "loader_address": "loader",
    "kvstore_address": "kvstore",
    "scheduler_address": "scheduler",
}
"""Setting (attribute) naming another layer's address -> that layer."""


@dataclass(frozen=True)
class Mount:
    """One entry of a service's ``volumes``, short or long syntax."""

    type: str
    source: str
    target: str
    read_only: bool


def parse_mount(entry: str | dict) -> Mount:
    if isinstance(entry, dict):
        return Mount(
            entry["type"], entry["source"], entry["target"], bool(entry.get("read_only", False))
        )
    source, target, *mode = entry.split(":")
    kind = "bind" if source.startswith(("/", ".", "~", "$")) else "volume"
    return Mount(kind, source, target, mode == ["ro"])


def mounts(service: dict) -> list[Mount]:
    return [parse_mount(entry) for entry in service.get("volumes", [])]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def depends_on(service: dict) -> set[str]:
    return set(service.get("depends_on", []))


def parse_layer_command(command: list[str]) -> argparse.Namespace:
    """Parses a compose command (the args after the image's ``zerolayer`` entrypoint)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"`zerolayer {' '.join(command)}` does not parse:\n{stderr.getvalue()}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def args(compose: dict) -> dict[str, argparse.Namespace]:
    return {layer: parse_layer_command(compose["services"][layer]["command"]) for layer in LAYERS}


@pytest.fixture(scope="module")
def run_mount(compose: dict) -> Mount:
    """The named volume every layer mounts at the same path (sockets and KV arena)."""
    per_layer = [
        {m for m in mounts(compose["services"][layer]) if m.type == "volume"} for layer in LAYERS
    ]
    shared = set.intersection(*per_layer)
    assert len(shared) == 1, per_layer
    return shared.pop()


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_runs_its_own_subcommand_of_the_image_entrypoint(compose: dict, layer: str) -> None:
    service = compose["services"][layer]
    command = service["command"]
    assert all(isinstance(arg, str) for arg in command), command
    assert command[0] == layer
    assert "entrypoint" not in service
    assert service["build"] == "."
    assert service["image"] == compose["services"]["loader"]["image"]
    assert parse_layer_command(command).command == layer


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_gets_every_flag_the_launcher_passes(
    compose: dict, args: dict[str, argparse.Namespace], layer: str, tmp_path: Path
) -> None:
    config = StackConfig(
        model_dir="/model", run_dir=str(tmp_path), metrics_port_base=METRICS_PORT_BASE
    )
    stack = Stack(config)  # NOTE: only builds command lines; starts nothing
    # --instance-id only serves the launcher's own health probe; compose has no launcher.
    launcher_flags = {arg for arg in stack.command(layer) if arg.startswith("--")} - {
        "--instance-id"
    }
    compose_flags = {arg for arg in compose["services"][layer]["command"] if arg.startswith("--")}
    assert launcher_flags <= compose_flags
    assert args[layer].metrics_port == config.metrics_port(layer)


@pytest.mark.parametrize("layer", LAYERS)
def test_every_compose_flag_is_a_setting_of_its_layer_and_none_restates_a_default(
    compose: dict, args: dict[str, argparse.Namespace], layer: str
) -> None:
    settings = {setting.flag: setting for setting in layer_settings(layer)}
    flags = [arg for arg in compose["services"][layer]["command"] if arg.startswith("--")]
    assert set(flags) <= set(settings), set(flags) - set(settings)
    assert len(flags) == len(set(flags)), flags
    parsed = {flag: getattr(args[layer], settings[flag].name) for flag in flags}
    assert {flag for flag in flags if parsed[flag] == settings[flag].default} == set()


def test_internal_addresses_agree_and_live_on_the_shared_volume(
    args: dict[str, argparse.Namespace], run_mount: Mount
) -> None:
    addresses = {layer: args[layer].address for layer in LAYERS[:3]}
    for layer, address in addresses.items():
        assert address == f"unix:{run_mount.target}/{layer}.sock"
    checked = []
    for layer in LAYERS:
        for name, target in DEPENDENCY_SETTINGS.items():
            if name in vars(args[layer]) and target != layer:
                # NOTE: the frontend's --scheduler takes several addresses; compose gives one.
                given = Setting.items(getattr(args[layer], name))
                assert given == (addresses[target],), (layer, name)
                checked.append((layer, target))
    assert len(checked) == 5  # kvstore, scheduler and frontend -> loader; -> kvstore; -> scheduler
    assert Path(args["kvstore"].shm_path).parent == Path(run_mount.target)


def test_layers_start_after_the_layers_they_call(
    compose: dict, args: dict[str, argparse.Namespace]
) -> None:
    for layer in LAYERS:
        given = vars(args[layer])
        needed = {t for name, t in DEPENDENCY_SETTINGS.items() if name in given and t != layer}
        assert needed <= depends_on(compose["services"][layer]), layer


def test_shared_volume_is_a_declared_tmpfs(compose: dict, run_mount: Mount) -> None:
    declared = compose["volumes"]
    for name, service in compose["services"].items():
        for mount in mounts(service):
            if mount.type == "volume":
                assert mount.source in declared, (name, mount)
    assert declared[run_mount.source]["driver_opts"]["type"] == "tmpfs"


def test_the_shared_volume_holds_the_kv_arena_and_the_sockets(
    compose: dict, args: dict[str, argparse.Namespace], run_mount: Mount
) -> None:
    # The kvstore reserves the whole arena at start and refuses to start when it does not fit;
    # the arena is on this volume, not in /dev/shm, so the containers need no shm_size.
    options = dict(
        option.split("=", 1)
        for option in compose["volumes"][run_mount.source]["driver_opts"]["o"].split(",")
    )
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    size = int(options["size"][:-1]) * units[options["size"][-1].lower()]
    assert size >= args["kvstore"].kv_cache_bytes + (1 << 20)
    assert not args["kvstore"].shm_path.startswith("/dev/shm/")


def test_model_is_mounted_read_only_at_the_same_path_in_loader_and_scheduler(
    compose: dict, args: dict[str, argparse.Namespace]
) -> None:
    model_path = args["loader"].model_dir
    found = {}
    for layer in ("loader", "scheduler"):
        [mount] = [m for m in mounts(compose["services"][layer]) if m.target == model_path]
        assert mount.type == "bind"
        assert mount.read_only
        assert "${MODEL_DIR" in mount.source
        found[layer] = mount
    assert found["loader"] == found["scheduler"]


def test_layers_share_one_ipc_namespace(compose: dict) -> None:
    ipc = {layer: compose["services"][layer].get("ipc") for layer in LAYERS}
    [holder] = [layer for layer, mode in ipc.items() if mode == "shareable"]
    for layer, mode in ipc.items():
        assert layer == holder or mode == f"service:{holder}", ipc


def test_published_frontend_port_is_the_one_it_listens_on(
    compose: dict, args: dict[str, argparse.Namespace]
) -> None:
    host, _, port = args["frontend"].listen.rpartition(":")
    assert host == "0.0.0.0"
    [published] = compose["services"]["frontend"]["ports"]
    assert str(published).split(":")[-1] == port


def test_the_public_port_is_published_on_the_hosts_loopback_unless_asked(compose: dict) -> None:
    [published] = compose["services"]["frontend"]["ports"]
    host, host_port, container_port = published.rsplit(":", 2)
    assert host == "${ZEROLAYER_PUBLISH_HOST:-127.0.0.1}"
    assert host_port == container_port == "50051"
    for service in compose["services"].values():  # Jaeger's and Prometheus's ports as well
        for entry in service.get("ports", []):
            assert entry.startswith(("127.0.0.1:", "${ZEROLAYER_PUBLISH_HOST:-127.0.0.1}:"))


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_exports_traces_to_jaeger(compose: dict, layer: str) -> None:
    env = environment(compose["services"][layer])
    assert env["OTEL_SERVICE_NAME"] == f"zerolayer-{layer}"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert "jaeger" in compose["services"]


def test_prometheus_scrapes_each_layers_metrics_port(
    compose: dict, args: dict[str, argparse.Namespace]
) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {f"{layer}:{args[layer].metrics_port}" for layer in LAYERS}
    [mount] = mounts(compose["services"]["prometheus"])
    assert (mount.source, mount.target) == (
        "./deploy/prometheus.yml",
        "/etc/prometheus/prometheus.yml",
    )


def test_dockerfile_installs_cpu_torch_and_enters_zerolayer() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim"
    [entrypoint] = [line for line in instructions if line.startswith("ENTRYPOINT ")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT ")) == ["zerolayer"]
    ci_torch = re.search(r"torch==[\w.]+", (ROOT / ".ci" / "run").read_text()).group()
    assert f"--index-url https://download.pytorch.org/whl/cpu {ci_torch}" in dockerfile
    assert "pip install -e ." in dockerfile


def dashboard_queries(dashboard: dict) -> list[str]:
    return [
        target["expr"]
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def test_dashboard_queries_only_exported_metrics_and_all_of_them() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "zerolayer-dashboard.json").read_text())
    series = {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    allowed = series | COUNTERS | GAUGES
    queried = {
        name for expr in dashboard_queries(dashboard) for name in re.findall(r"zerolayer_\w+", expr)
    }
    assert queried <= allowed, queried - allowed
    covered = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried}
    assert covered == HISTOGRAMS | COUNTERS | GAUGES
    for expr in dashboard_queries(dashboard):
        if "histogram_quantile" in expr:
            assert "_bucket" in expr, expr


def test_dashboard_reads_a_chosen_prometheus_in_its_rows() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "zerolayer-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 39
    [variable] = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Load", "Inference", "Routing and capacity", "Processes"]
    for panel in dashboard["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${" + variable["name"] + "}", panel["title"]


def dockerfile_instructions() -> list[str]:
    """The Dockerfile's instructions, one string each (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [
        " ".join(part.split())
        for part in "\n".join(lines).replace("\\\n", " ").splitlines()
        if part.strip()
    ]


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """``.dockerignore`` as (excludes, pattern) rules, in order: Docker's syntax (Go's
    filepath.Match plus ``**`` for any number of directories, ``!`` re-includes; the last
    matching rule wins; a rule that matches a directory matches everything in it).
    https://docs.docker.com/build/concepts/context/#dockerignore-files"""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        rules.append((excludes, re.compile(regex + "(/.*)?")))
    return rules


def in_build_context(path: str) -> bool:
    """Whether ``.dockerignore`` lets ``path`` (relative to the repository) into the context."""
    included = True
    for excludes, pattern in dockerignore_rules():
        if pattern.fullmatch(path):
            included = not excludes
    return included


def test_dockerignore_matches_as_docker_does() -> None:
    # The matcher above, on paths whose fate the file's rules decide one way or the other.
    assert in_build_context("csrc/paged_attention.cpp")
    assert in_build_context("zerolayer/scheduler/model/kernels.py")
    assert not in_build_context("zerolayer/scheduler/__pycache__/engine.cpython-311.pyc")
    assert not in_build_context("zerolayer/v1/generation_pb2.py")
    assert not in_build_context("Dockerfile")


def test_build_context_holds_what_the_image_copies_and_nothing_else() -> None:
    copies = [line.split()[1:] for line in dockerfile_instructions() if line.startswith("COPY ")]
    sources = [source.rstrip("/") for *sources, _ in copies for source in sources]
    assert {"pyproject.toml", "setup.py", "README.md", "protos", "csrc", "zerolayer"} <= set(
        sources
    )
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for source in sources:
        assert (ROOT / source).exists(), source
        under = [path for path in tracked if path == source or path.startswith(source + "/")]
        assert under, source
        assert [path for path in under if not in_build_context(path)] == [], source
    copied = tuple(source + "/" for source in sources)
    for path in tracked:  # every other file stays out: tests, docs, deploy, scripts, ...
        assert in_build_context(path) == (path in sources or path.startswith(copied)), path
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        ".pytest_cache/README.md",
        ".ruff_cache/CACHEDIR.TAG",
        "bench-results/run.json",
        "tests/conftest.py",
        "zerolayer.egg-info/PKG-INFO",
        "zerolayer/v1/generation_pb2.py",  # generated again by setup.py in the image
        "zerolayer/frontend/__pycache__/server.cpython-311.pyc",
        "csrc/build/zerolayer_paged_attention.so",
        "zerolayer/scheduler/model/native/prebuilt/libzerolayer_kernels.so",
        "zerolayer/scheduler/model/native/prebuilt/build.json",
    ):
        assert not in_build_context(path), path


def test_image_has_the_native_kernels_built_where_the_scheduler_looks() -> None:
    instructions = dockerfile_instructions()
    copied = {
        line.split()[1].rstrip("/"): line.split()[2].rstrip("/")
        for line in instructions
        if line.startswith("COPY ")
    }
    # The scheduler looks for csrc/ beside the zerolayer/ package: an editable install (as CI's)
    # keeps the package in the WORKDIR the sources were copied to.
    assert kernels.CSRC_DIR == Path(zerolayer.__file__).resolve().parents[1] / "csrc"
    assert copied["csrc"] == "csrc" and copied["zerolayer"] == "zerolayer"
    installs = [
        line for line in instructions if re.search(r"\bpip install (-e|--editable) \.", line)
    ]
    assert installs, "the package is not installed editable from the WORKDIR"
    assert instructions.index(installs[0]) > max(
        i for i, line in enumerate(instructions) if line.startswith("COPY ")
    )
    # A C++ compiler for the install, which compiles the kernels into the package (setup.py), and
    # nothing else: no ninja, no torch headers ...
    [apt] = [line for line in instructions if "apt-get install" in line]
    assert re.search(r"\bg\+\+(\s|$)", apt), apt
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in dependencies if d.startswith("ninja")]
    # ... and, before the runtime user takes over, the install-time library made sure of.
    [build] = [line for line in instructions if f"-m {native_build.__name__} --prebuilt" in line]
    assert instructions.index(build) > instructions.index(installs[0])
    assert not [line for line in instructions if "ZEROLAYER_KERNEL_CACHE" in line]
    user = [line for line in instructions if line.startswith("USER ")]
    assert user == ["USER zerolayer"] and instructions.index(user[0]) > instructions.index(build)
    assert any(line.startswith("RUN useradd") and "--uid 10001" in line for line in instructions)
