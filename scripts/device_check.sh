#!/usr/bin/env bash
# The GPU check, in one command on a machine with a CUDA device (the lent H200; see
# docs/benchmarks.md "GPU"): runs the gpu-marked tests, then zerolayer/bench/device_check.py (a ~1B dummy
# model: batch-1 decode vs the HBM bound, 64-request throughput vs transformers on the same GPU,
# device memory per layer, kill -9 of the loader mid-generation), then the NVML self-check of the
# scheduler's GPU health wiring (zerolayer/scheduler/gpu_health/nvml_check.py: the supported event types are
# registered, a wait returns, polling reads sane values), and prints ONE JSON document.
# Budget: under 8 minutes. Exit code 0 only when every gpu test passed and both checks ran.
#
# Packages the GPU image lacks travel as wheels in .whl (bash scripts/device_wheels.sh, here), and
# the generated protobuf package zerolayer/ travels with the tree (it is git-ignored):
#   run(command="bash scripts/device_check.sh", carry=[".whl", "zerolayer"], timeout_s=540)
# Logs and the JSON land in $OUT (the device tool's folder) or /tmp/zerolayer-device-check.
# A dry run of the plumbing on a CPU machine (the gpu tests are then deselected):
#   SKIP_WHEELS=1 DEVICE=cpu PRESET=tiny PYTHON=.venv/bin/python bash scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-/tmp/zerolayer-device-check}
mkdir -p "$OUT_DIR"
rm -rf "$OUT_DIR"/gpu-tests.xml "$OUT_DIR"/gpu-tests.log "$OUT_DIR"/device_check.json \
  "$OUT_DIR"/device_check.log "$OUT_DIR"/nvml_check.json "$OUT_DIR"/nvml_check.log \
  "$OUT_DIR"/logs  # never report an earlier run's results as this one's
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda:0}
PRESET=${PRESET:-1b}
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/zerolayer-site .whl/*.whl > "$OUT_DIR/pip.log" 2>&1 || {
      echo '{"error": "installing the carried wheels failed", "log": "pip.log"}'; exit 1; }
  export PYTHONPATH="/tmp/zerolayer-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ ! -f zerolayer/v1/generation_pb2.py ]; then
  echo '{"error": "zerolayer/ (generated protobuf code) missing: carry it (see the header)"}'
  exit 1
fi
# Not the launcher's pdeathsig of a dead session, not a stale torch extension build: fresh state.
export ZEROLAYER_KERNEL_CACHE="${ZEROLAYER_KERNEL_CACHE:-/tmp/zerolayer-kernels}"

start=$(date +%s)
timeout 270 "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts="" --timeout 240 \
  --junitxml="$OUT_DIR/gpu-tests.xml" tests > "$OUT_DIR/gpu-tests.log" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - start ))

start=$(date +%s)
timeout 240 "$PY" -m zerolayer.bench.device_check --device "$DEVICE" --preset "$PRESET" --log-dir "$OUT_DIR/logs" \
  > "$OUT_DIR/device_check.json" 2> "$OUT_DIR/device_check.log"
bench_rc=$?
bench_s=$(( $(date +%s) - start ))

if [[ "$DEVICE" == cuda* ]]; then
  index=${DEVICE#cuda}; index=${index#:}
  timeout 60 "$PY" -m zerolayer.scheduler.gpu_health.nvml_check "${index:-0}" \
    > "$OUT_DIR/nvml_check.json" 2> "$OUT_DIR/nvml_check.log"
  nvml_rc=$?
else
  echo '{"skipped": "DEVICE is not a CUDA device"}' > "$OUT_DIR/nvml_check.json"
  nvml_rc=0
fi

"$PY" - "$OUT_DIR" "$tests_rc" "$tests_s" "$bench_rc" "$bench_s" "$nvml_rc" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, tests_rc, tests_s, bench_rc, bench_s, nvml_rc = Path(sys.argv[1]), *map(int, sys.argv[2:])
doc = {"gpu_tests": {"exit_code": tests_rc, "seconds": tests_s}, "bench": None,
       "bench_exit_code": bench_rc, "bench_seconds": bench_s, "nvml": None,
       "nvml_exit_code": nvml_rc}
if tests_rc == 5:
    doc["gpu_tests"]["note"] = "no test ran: without a CUDA device the gpu tests are deselected"
try:
    suite = ET.parse(out / "gpu-tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    cases = suite.findall("testcase")
    doc["gpu_tests"].update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    doc["gpu_tests"]["not_passed"] = [
        f"{c.get('classname')}::{c.get('name')}: {(c[0].get('message') or '')[:300]}"
        for c in cases if len(c)
    ]
except Exception as exc:  # noqa: BLE001
    doc["gpu_tests"]["error"] = f"{type(exc).__name__}: {exc}"
    doc["gpu_tests"]["log_tail"] = (out / "gpu-tests.log").read_text(errors="replace")[-3000:]
try:
    doc["bench"] = json.loads((out / "device_check.json").read_text())
except Exception as exc:  # noqa: BLE001
    doc["bench_error"] = f"{type(exc).__name__}: {exc}"
    doc["bench_log_tail"] = (out / "device_check.log").read_text(errors="replace")[-3000:]
try:
    doc["nvml"] = json.loads((out / "nvml_check.json").read_text())
except Exception as exc:  # noqa: BLE001
    doc["nvml_error"] = f"{type(exc).__name__}: {exc}"
    doc["nvml_log_tail"] = (out / "nvml_check.log").read_text(errors="replace")[-3000:]
print(json.dumps(doc, indent=2, default=str))
ok = tests_rc == 0 and bench_rc == 0 and nvml_rc == 0 and doc["bench"] is not None
sys.exit(0 if ok else 1)
PY
