"""The custom resources of deploy/kubernetes/ (kinds kubernetes-validate has no schema for),
checked field by field against the fields their published API reference documents.

Each ``*_FIELDS`` below transcribes, from the page in its comment, the fields of that kind this
project may use (a subset of the reference: the fields zerolayer's manifests need and their
near neighbours); a field not listed is a typo or a field of another version. Core types nested
in them (a ServingRuntime's containers and volumes) are validated with kubernetes-validate."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kubernetes_manifests import ANY, KUBERNETES, KUBERNETES_VERSION, load_documents, unknown_fields

METADATA = {"name": ANY, "namespace": ANY, "labels": ANY, "annotations": ANY}
LABEL_SELECTOR = {"matchLabels": ANY, "matchExpressions": ANY}

# https://prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.ServiceMonitor
# (ServiceMonitorSpec; Endpoint)
SERVICE_MONITOR_FIELDS = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": METADATA,
    "spec": {
        "jobLabel": ANY,
        "targetLabels": ANY,
        "podTargetLabels": ANY,
        "endpoints": [
            {
                "port": ANY,
                "targetPort": ANY,
                "path": ANY,
                "scheme": ANY,
                "params": ANY,
                "interval": ANY,
                "scrapeTimeout": ANY,
                "honorLabels": ANY,
                "honorTimestamps": ANY,
                "relabelings": ANY,
                "metricRelabelings": ANY,
            }
        ],
        "selector": LABEL_SELECTOR,
        "namespaceSelector": {"any": ANY, "matchNames": ANY},
        "sampleLimit": ANY,
    },
}

# https://keda.sh/docs/2.18/reference/scaledobject-spec/ and, for the trigger's metadata,
# https://keda.sh/docs/2.18/scalers/prometheus/
SCALED_OBJECT_FIELDS = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": METADATA,
    "spec": {
        "scaleTargetRef": {
            "apiVersion": ANY,
            "kind": ANY,
            "name": ANY,
            "envSourceContainerName": ANY,
        },
        "pollingInterval": ANY,
        "cooldownPeriod": ANY,
        "initialCooldownPeriod": ANY,
        "idleReplicaCount": ANY,
        "minReplicaCount": ANY,
        "maxReplicaCount": ANY,
        "fallback": {"failureThreshold": ANY, "replicas": ANY},
        "advanced": {
            "restoreToOriginalReplicaCount": ANY,
            "horizontalPodAutoscalerConfig": {"name": ANY, "behavior": ANY},
            "scalingModifiers": ANY,
        },
        "triggers": [
            {
                "type": ANY,
                "name": ANY,
                "metricType": ANY,
                "useCachedMetrics": ANY,
                "authenticationRef": ANY,
                "metadata": {
                    "serverAddress": ANY,
                    "query": ANY,
                    "threshold": ANY,
                    "activationThreshold": ANY,
                    "namespace": ANY,
                    "customHeaders": ANY,
                    "ignoreNullValues": ANY,
                    "queryParameters": ANY,
                    "unsafeSsl": ANY,
                },
            }
        ],
    },
}
KEDA_METRIC_TYPES = {"AverageValue", "Value", "Utilization"}

# https://kserve.github.io/website/docs/reference/crd-api (ServingRuntimeSpec, SupportedModelFormat)
SERVING_RUNTIME_FIELDS = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": METADATA,
    "spec": {
        "supportedModelFormats": [
            {"name": ANY, "version": ANY, "autoSelect": ANY, "priority": ANY}
        ],
        "protocolVersions": ANY,
        "multiModel": ANY,
        "disabled": ANY,
        "containers": ANY,  # core Containers: validated below
        "volumes": ANY,  # core Volumes: validated below
        "nodeSelector": ANY,
        "affinity": ANY,
        "tolerations": ANY,
        "labels": ANY,
        "annotations": ANY,
        "imagePullSecrets": ANY,
    },
}
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}

# https://kserve.github.io/website/docs/reference/crd-api (InferenceServiceSpec, PredictorSpec,
# ModelSpec, ModelFormat); deployment modes: the serving.kserve.io/deploymentMode annotation
INFERENCE_SERVICE_FIELDS = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": METADATA,
    "spec": {
        "predictor": {
            "minReplicas": ANY,
            "maxReplicas": ANY,
            "scaleTarget": ANY,
            "scaleMetric": ANY,
            "serviceAccountName": ANY,
            "model": {
                "modelFormat": {"name": ANY, "version": ANY},
                "runtime": ANY,
                "protocolVersion": ANY,
                "storageUri": ANY,
                "resources": ANY,
                "env": ANY,
                "args": ANY,
            },
        },
    },
}
KSERVE_DEPLOYMENT_MODES = {"Serverless", "RawDeployment"}

# https://gateway-api-inference-extension.sigs.k8s.io/reference/spec/
# (inference.networking.k8s.io/v1: InferencePoolSpec, Port, EndpointPickerRef, AppProtocol,
# EndpointPickerFailureMode)
INFERENCE_POOL_FIELDS = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": METADATA,
    "spec": {
        "selector": {"matchLabels": ANY},
        "targetPorts": [{"number": ANY}],
        "appProtocol": ANY,
        "endpointPickerRef": {
            "group": ANY,
            "kind": ANY,
            "name": ANY,
            "port": {"number": ANY},
            "failureMode": ANY,
        },
    },
}
INFERENCE_POOL_APP_PROTOCOLS = {"http", "kubernetes.io/h2c"}
FAILURE_MODES = {"FailOpen", "FailClose"}
MAX_TARGET_PORTS = 8

CUSTOM_RESOURCES = {
    "monitoring/servicemonitor.yaml": ("monitoring.coreos.com/v1", "ServiceMonitor"),
    "examples/keda/scaledobject.yaml": ("keda.sh/v1alpha1", "ScaledObject"),
    "examples/kserve/servingruntime.yaml": ("serving.kserve.io/v1alpha1", "ServingRuntime"),
    "examples/kserve/inferenceservice.yaml": ("serving.kserve.io/v1beta1", "InferenceService"),
    "examples/inference-gateway/inferencepool.yaml": (
        "inference.networking.k8s.io/v1",
        "InferencePool",
    ),
}
FIELDS = {
    "ServiceMonitor": SERVICE_MONITOR_FIELDS,
    "ScaledObject": SCALED_OBJECT_FIELDS,
    "ServingRuntime": SERVING_RUNTIME_FIELDS,
    "InferenceService": INFERENCE_SERVICE_FIELDS,
    "InferencePool": INFERENCE_POOL_FIELDS,
}


def custom_resource(path: str) -> dict[str, Any]:
    [obj] = load_documents(KUBERNETES / path)
    return obj


@pytest.mark.parametrize("path", CUSTOM_RESOURCES)
def test_each_custom_resource_uses_only_documented_fields(path: str) -> None:
    obj = custom_resource(path)
    assert (obj["apiVersion"], obj["kind"]) == CUSTOM_RESOURCES[path]
    assert unknown_fields(obj, FIELDS[obj["kind"]]) == []


def test_a_field_of_another_version_is_refused() -> None:
    pool = custom_resource("examples/inference-gateway/inferencepool.yaml")
    # v1alpha2's names: targetPortNumber and extensionRef
    pool["spec"]["targetPortNumber"] = pool["spec"].pop("targetPorts")[0]["number"]
    assert unknown_fields(pool, INFERENCE_POOL_FIELDS) == [".spec.targetPortNumber"]


def test_the_service_monitor_has_its_required_fields() -> None:
    spec = custom_resource("monitoring/servicemonitor.yaml")["spec"]
    assert spec["selector"]["matchLabels"]
    assert all("port" in endpoint for endpoint in spec["endpoints"])


def test_the_scaled_object_has_its_required_fields_and_values() -> None:
    spec = custom_resource("examples/keda/scaledobject.yaml")["spec"]
    assert spec["scaleTargetRef"]["name"]
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] in KEDA_METRIC_TYPES
    assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
    assert all(isinstance(value, str) for value in trigger["metadata"].values())  # a string map
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_the_serving_runtime_speaks_grpc_v2_and_its_pod_parts_are_valid() -> None:
    runtime = custom_resource("examples/kserve/servingruntime.yaml")
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) <= KSERVE_PROTOCOLS
    assert "grpc-v2" in spec["protocolVersions"]
    assert all(model["name"] for model in spec["supportedModelFormats"])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": runtime["metadata"]["name"]},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_the_inference_service_names_the_runtime_and_its_format() -> None:
    service = custom_resource("examples/kserve/inferenceservice.yaml")
    runtime = custom_resource("examples/kserve/servingruntime.yaml")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    mode = service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"]
    assert mode in KSERVE_DEPLOYMENT_MODES


def test_the_inference_pool_has_its_required_fields_and_values() -> None:
    spec = custom_resource("examples/inference-gateway/inferencepool.yaml")["spec"]
    assert spec["selector"]["matchLabels"]
    ports = [port["number"] for port in spec["targetPorts"]]
    assert 1 <= len(ports) <= MAX_TARGET_PORTS and len(set(ports)) == len(ports)
    assert spec["appProtocol"] in INFERENCE_POOL_APP_PROTOCOLS
    ref = spec["endpointPickerRef"]
    assert ref["name"] and ref["failureMode"] in FAILURE_MODES
    assert ref.get("kind", "Service") != "Service" or "port" in ref  # a Service needs its port
