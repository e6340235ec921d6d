"""deploy/kubernetes/, checked without a cluster: every core object of each overlay (and of the
examples) passes kubernetes-validate's strict schemas of a current Kubernetes, and what ties the
objects together holds: each container's args parse with the real CLI, the probes reach the
sockets and ports the layers serve, the volumes hold the sockets, the KV arena and the model,
the Service, ServiceMonitor, autoscalers and routers name the ports and metrics the layers
really export. The custom resources are checked in tests/test_kubernetes_custom_resources.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any
from unittest import mock

import kubernetes_validate
import pytest
import yaml
from kubernetes_manifests import (
    KUBERNETES,
    KUBERNETES_VERSION,
    containers,
    load_documents,
    one,
    render,
)
from prometheus_client import CollectorRegistry
from test_compose import parse_layer_command

from zerolayer.bench.inprocess import LocalModel
from zerolayer.checkpoints.dummy import write_dummy_model
from zerolayer.common.setting import Setting, parse_bytes
from zerolayer.common.settings import LAYERS, layer_settings

OVERLAYS = ("cpu", "gpu")
IMAGES = {"cpu": "zerolayer:cpu", "gpu": "zerolayer:cuda"}
RUN = "run"
"""The pod volume of the sockets and the KV arena."""
EXAMPLE_CORE_OBJECTS = ("examples/inference-gateway/endpoint-picker.yaml",)
"""Example files that hold only core (built-in) kinds."""
DEPENDENCY_SETTINGS = {"loader_address": "loader", "kvstore_address": "kvstore"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(KUBERNETES / "overlays" / overlay) for overlay in OVERLAYS}


def layer_args(container: dict[str, Any]) -> argparse.Namespace:
    """A container's args parsed by the real CLI, on a node with one GPU (``--device cuda``
    is checked against the machine's devices: this one may have none)."""
    with mock.patch("zerolayer.common.device._torch_cuda_device_count", return_value=1):
        return parse_layer_command(container["args"])


def volume(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return found


def mount_path(container: dict[str, Any], name: str) -> str:
    [found] = [m for m in container["volumeMounts"] if m["name"] == name]
    return found["mountPath"]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (binary suffixes, as these manifests use) in bytes."""
    return parse_bytes(text.removesuffix("i"))


# -- kubernetes-validate


def test_every_core_object_is_valid_for_a_current_kubernetes(rendered) -> None:
    objects = [obj for overlay in OVERLAYS for obj in rendered[overlay]]
    for path in EXAMPLE_CORE_OBJECTS:
        objects += load_documents(KUBERNETES / path)
    assert len(objects) == 2 * 5 + 5  # 5 per overlay; the EPP's 5
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.path}: {exc.message}")


def test_the_validator_refuses_a_field_kubernetes_does_not_know(rendered) -> None:
    deployment = one(rendered["cpu"], "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# -- the pod


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_layer_runs_its_own_subcommand_with_flags_of_its_own(rendered, overlay) -> None:
    pod = containers(one(rendered[overlay], "Deployment"))
    assert list(pod) == list(LAYERS)
    images = {c["image"] for c in pod.values()}
    assert images == {IMAGES[overlay]}
    for layer, container in pod.items():
        assert "command" not in container  # the image's entrypoint is `zerolayer`
        assert container["args"][0] == layer
        args = layer_args(container)
        settings = {setting.flag: setting for setting in layer_settings(layer)}
        flags = [arg for arg in container["args"] if arg.startswith("--")]
        assert set(flags) <= set(settings), set(flags) - set(settings)
        restated = {f for f in flags if getattr(args, settings[f].name) == settings[f].default}
        assert restated == set(), (layer, restated)
        assert args.metrics_host == "0.0.0.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_addresses_agree_and_live_on_the_memory_volume(rendered, overlay) -> None:
    deployment = one(rendered[overlay], "Deployment")
    pod = containers(deployment)
    run_path = {mount_path(c, RUN) for c in pod.values()}
    assert len(run_path) == 1
    [run_dir] = run_path
    args = {layer: layer_args(pod[layer]) for layer in LAYERS}
    addresses = {layer: f"unix:{run_dir}/{layer}.sock" for layer in LAYERS[:3]}
    for layer in LAYERS[:3]:
        assert args[layer].address == addresses[layer]
    for layer in LAYERS:
        for name, target in DEPENDENCY_SETTINGS.items():
            if name in vars(args[layer]) and target != layer:
                assert getattr(args[layer], name) == addresses[target], (layer, name)
    assert Setting.items(args["frontend"].scheduler_address) == (addresses["scheduler"],)
    assert Path(args["kvstore"].shm_path).parent == Path(run_dir)
    assert volume(deployment, RUN)["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_memory_volume_and_the_kvstore_hold_the_kv_arena(rendered, overlay) -> None:
    deployment = one(rendered[overlay], "Deployment")
    kvstore = containers(deployment)["kvstore"]
    arena = layer_args(kvstore).kv_cache_bytes
    size = quantity_bytes(volume(deployment, RUN)["emptyDir"]["sizeLimit"])
    assert size >= arena + (1 << 20)  # the arena and the sockets
    # The kvstore touches every page of the arena first: they are charged to its memory.
    limit = quantity_bytes(kvstore["resources"]["limits"]["memory"])
    assert limit >= arena + (256 << 20)
    assert quantity_bytes(kvstore["resources"]["requests"]["memory"]) >= arena


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_model_is_the_claims_volume_read_only_at_the_same_path(rendered, overlay) -> None:
    deployment = one(rendered[overlay], "Deployment")
    pod = containers(deployment)
    claim = one(rendered[overlay], "PersistentVolumeClaim")
    model = volume(deployment, "model")["persistentVolumeClaim"]
    assert model == {"claimName": claim["metadata"]["name"], "readOnly": True}
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]  # every replica, any node
    model_dir = layer_args(pod["loader"]).model_dir
    for layer in ("loader", "scheduler"):  # the loader's manifest holds absolute paths
        [mount] = [m for m in pod[layer]["volumeMounts"] if m["name"] == "model"]
        assert mount == {"name": "model", "mountPath": model_dir, "readOnly": True}
    for layer in ("kvstore", "frontend"):
        assert [m["name"] for m in pod[layer]["volumeMounts"]] == [RUN]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_is_requested_and_memory_limited(rendered, overlay) -> None:
    for layer, container in containers(one(rendered[overlay], "Deployment")).items():
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), layer
        assert "memory" in resources["limits"], layer


def probe_argv(probe: dict[str, Any]) -> list[str]:
    command = probe["exec"]["command"]
    assert command[:2] == ["zerolayer", "health"], command
    parse_layer_command(command[1:])  # the real CLI parses it
    return command[2:]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_internal_layers_probes_check_their_own_socket(rendered, overlay) -> None:
    for layer, container in containers(one(rendered[overlay], "Deployment")).items():
        if layer == "frontend":
            continue
        address = layer_args(container).address
        for kind in ("startupProbe", "livenessProbe"):
            assert probe_argv(container[kind]) == ["--address", address], (layer, kind)
        assert "readinessProbe" not in container  # readiness is the pod's frontend's


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_frontend_is_ready_by_grpc_health_and_alive_by_any_answer(rendered, overlay) -> None:
    frontend = containers(one(rendered[overlay], "Deployment"))["frontend"]
    args = layer_args(frontend)
    host, _, port = args.listen.rpartition(":")
    assert host == "0.0.0.0"
    assert frontend["readinessProbe"]["grpc"] == {"port": int(port)}  # overall health
    for kind in ("startupProbe", "livenessProbe"):
        assert probe_argv(frontend[kind]) == ["--address", f"127.0.0.1:{port}", "--alive"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_container_ports_are_the_ports_the_layers_listen_on(rendered, overlay) -> None:
    pod = containers(one(rendered[overlay], "Deployment"))
    for layer, container in pod.items():
        args = layer_args(container)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert METRICS_PORT_NAMES[layer] in ports
        assert ports[METRICS_PORT_NAMES[layer]] == args.metrics_port
    front = layer_args(pod["frontend"])
    ports = {p["name"]: p["containerPort"] for p in pod["frontend"]["ports"]}
    assert ports["grpc"] == port_of(front.listen)
    assert ports["http"] == port_of(front.http_listen)


METRICS_PORT_NAMES = {
    "loader": "loader-metrics",
    "kvstore": "kv-metrics",
    "scheduler": "sched-metrics",
    "frontend": "front-metrics",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_selects_the_pods_and_targets_their_named_ports(rendered, overlay) -> None:
    deployment = one(rendered[overlay], "Deployment")
    service = one(rendered[overlay], "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    named = {
        p["name"]: p["containerPort"] for c in containers(deployment).values() for p in c["ports"]
    }
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in named, port
        assert port["port"] == named[port["targetPort"]], port
    grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc[0]["appProtocol"] == "kubernetes.io/h2c"
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(named)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_budget_and_the_autoscaler_name_the_deployment(rendered, overlay) -> None:
    deployment = one(rendered[overlay], "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = one(rendered[overlay], "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    hpa = one(rendered[overlay], "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= pdb["spec"]["maxUnavailable"] + 1
    assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_the_gpu_overlay_puts_the_three_device_layers_on_one_cuda_gpu(rendered) -> None:
    deployment = one(rendered["gpu"], "Deployment")
    pod = containers(deployment)
    for layer in ("loader", "kvstore", "scheduler"):
        assert layer_args(pod[layer]).device == "cuda:0", layer
    assert pod["scheduler"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    for layer in ("loader", "kvstore"):
        assert pod[layer]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert "nvidia.com/gpu" not in str(pod["frontend"]["resources"])
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.count": "1"}  # "all" = the scheduler's GPU
    cpu = containers(one(rendered["cpu"], "Deployment"))
    for layer in ("loader", "kvstore", "scheduler"):
        assert layer_args(cpu[layer]).device == "cpu", layer
        assert pod[layer]["args"] == [*cpu[layer]["args"], "--device", "cuda"]


# -- monitoring, autoscaling and routers: ports and metric names


@pytest.fixture(scope="module")
def scheduler_metric_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The names of the series a real scheduler's registry exports (engine built in-process)."""
    from scheduler.test_engine_factory import CONFIG, PRESET, make_parts

    from zerolayer.scheduler.engine_factory import assemble_engine

    model = LocalModel.load(write_dummy_model(tmp_path_factory.mktemp("dummy"), PRESET, seed=1))
    registry = CollectorRegistry()
    assemble_engine(make_parts(model), CONFIG, registry)
    return {sample.name for metric in registry.collect() for sample in metric.samples}


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bzerolayer_\w+", text))


def test_the_service_monitor_scrapes_every_layers_metrics_port(rendered) -> None:
    [monitor] = load_documents(KUBERNETES / "monitoring" / "servicemonitor.yaml")
    service = one(rendered["cpu"], "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    scraped = [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]]
    assert scraped == [METRICS_PORT_NAMES[layer] for layer in LAYERS]
    assert set(scraped) <= {p["name"] for p in service["spec"]["ports"]}
    assert {endpoint["path"] for endpoint in monitor["spec"]["endpoints"]} == {"/metrics"}


def test_the_autoscalers_read_the_schedulers_queue_depth(rendered, scheduler_metric_names) -> None:
    hpa = one(rendered["cpu"], "HorizontalPodAutoscaler")
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "zerolayer_scheduler_requests_waiting"
    adapter = yaml.safe_load(
        (KUBERNETES / "monitoring" / "prometheus-adapter-rules.yaml").read_text()
    )
    served = set()
    for rule in adapter["rules"]["custom"]:
        [name] = metric_names(rule["seriesQuery"])
        assert rule["name"] == {"matches": "^(.*)$", "as": "${1}"}  # served under its own name
        served.add(name)
    assert metric["pods"]["metric"]["name"] in served
    [scaled] = load_documents(KUBERNETES / "examples" / "keda" / "scaledobject.yaml")
    [trigger] = scaled["spec"]["triggers"]
    keda_names = metric_names(trigger["metadata"]["query"])
    assert keda_names == {"zerolayer_scheduler_requests_waiting"}
    assert served | keda_names <= scheduler_metric_names, (
        served | keda_names
    ) - scheduler_metric_names
    assert scaled["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]
    assert 'service="zerolayer"' in trigger["metadata"]["query"]


def flag_values(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a Go program's args (every flag here takes a value)."""
    assert len(args) % 2 == 0 and all(flag.startswith("--") for flag in args[::2]), args
    return dict(zip(args[::2], args[1::2], strict=True))


def test_the_endpoint_picker_reads_the_schedulers_metrics_port(
    rendered, scheduler_metric_names
) -> None:
    gateway = KUBERNETES / "examples" / "inference-gateway"
    objects = load_documents(gateway / "endpoint-picker.yaml")
    [pool] = load_documents(gateway / "inferencepool.yaml")
    epp = one(objects, "Deployment")
    [container] = containers(epp).values()
    flags = flag_values(container["args"])
    metrics = {flag: value for flag, value in flags.items() if flag.endswith("-metric")}
    assert metrics == {
        "--total-queued-requests-metric": "zerolayer_scheduler_requests_waiting",
        "--kv-cache-usage-percentage-metric": "zerolayer_scheduler_kv_cache_utilization",
        "--lora-info-metric": "",
    }
    assert {v for v in metrics.values() if v} <= scheduler_metric_names
    pod = containers(one(rendered["cpu"], "Deployment"))
    assert int(flags["--model-server-metrics-port"]) == layer_args(pod["scheduler"]).metrics_port
    assert flags["--pool-name"] == pool["metadata"]["name"]
    labels = one(rendered["cpu"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pool["spec"]["targetPorts"] == [
        {"number": port_of(layer_args(pod["frontend"]).http_listen)}
    ]
    service = one(objects, "Service")
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["kind"], ref["name"]) == ("Service", service["metadata"]["name"])
    assert ref["port"]["number"] == service["spec"]["ports"][0]["port"] == int(flags["--grpc-port"])
    assert (
        service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    )


def test_kserve_runs_the_same_layers_with_the_frontend_as_its_container(rendered) -> None:
    runtime = load_documents(KUBERNETES / "examples" / "kserve" / "servingruntime.yaml")[0]
    served = {c["name"]: c for c in runtime["spec"]["containers"]}
    assert list(served) == ["kserve-container", "loader", "kvstore", "scheduler"]
    base = containers(one(rendered["cpu"], "Deployment"))
    for layer in ("loader", "kvstore", "scheduler"):
        assert served[layer]["args"] == base[layer]["args"], layer
        layer_args(served[layer])
    frontend = served["kserve-container"]
    args = layer_args(frontend)
    assert args.command == "frontend"
    # KServe routes gRPC only: the base's frontend args less the OpenAI HTTP port
    http = base["frontend"]["args"].index("--http-listen")
    base_args = base["frontend"]["args"]
    assert frontend["args"] == base_args[:http] + base_args[http + 2 :]
    assert frontend["ports"] == [
        {"name": "h2c", "containerPort": port_of(args.listen), "protocol": "TCP"}
    ]
    volumes = {v["name"]: v for v in runtime["spec"]["volumes"]}
    base_volumes = {
        v["name"]: v
        for v in one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes == base_volumes
