#!/usr/bin/env bash
# Downloads, into .whl/, the Python 3.12 x86-64 wheels the lent GPU machine lacks (it has torch,
# triton, transformers, cuda-bindings, nvidia-ml-py, but not our gRPC/protobuf/OTel pins), so that
# scripts/device_check.sh can install them there without a package registry.
# It also generates zerolayer/v1 and zerolayer/kserve (the protobuf code, git-ignored) from protos/ again, so the copy
# carried matches the protos. Run here (where pip works), then carry .whl, zerolayer/v1, zerolayer/kserve:
#   bash scripts/device_wheels.sh
#   run(command="bash scripts/device_check.sh", carry=[".whl", "zerolayer/v1", "zerolayer/kserve"], timeout_s=480)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .whl
# Pinned like pyproject.toml: the generated protobuf/gRPC code needs these exact runtimes.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform any -d .whl \
  grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
  opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
  opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos==1.76.0 pytest-timeout==2.4.0
ls -la .whl
du -sh .whl
"$PY" -c "import setup; setup.generate_protos()"
echo "zerolayer/ generated from protos/"
