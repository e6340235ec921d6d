#!/usr/bin/env bash
# The GPU device check, in one command on a machine with a CUDA device (the lent H200; see
# docs/gpu.md "The device check" and docs/benchmarks.md "GPU"). It has NOT run on a GPU yet.
#
# Steps, each with its own bound (seconds):
#   setup       30  the generated zerolayer/ package is there; the carried wheels (.whl: our
#                   gRPC, protobuf, OpenTelemetry and pytest-timeout pins) go into /tmp
#   versions    25  torch, Triton, cuda-bindings, nvidia-ml-py, driver, uname -r, the GPU, and
#                   whether Triton and cuda-bindings import
#   nvml        20  python -m zerolayer.scheduler.gpu_health.nvml_check (event types registered, a wait, the
#                   recovery action field, polling)
#   gpu_unit   110  pytest -m gpu --gpu-strict on the files with gpu-marked tests outside
#                   tests/e2e (pytest-xdist, 4 workers, when it imports); 60 s per test
#   gpu_stack   95  the same on tests/e2e (one GPU stack); 80 s per test
#   bench      120  benchmarks/device/check.py on the 1.1B dummy model: copy bandwidth, batch-1 decode
#                   against the HBM bound, 64-request throughput, device memory per layer, kill -9
#                   of the loader, transformers on the same GPU
# The whole run ends within 420 s (7 minutes): each bound is also cut to what is left of that
# budget, less 15 s for the summary, and `timeout` sends SIGTERM at the bound and SIGKILL 5 s later.
# A gpu-marked test that skips, or a module skipped at collection, fails (--gpu-strict).
#
# After every step it rewrites two files in $OUT, the only two it leaves there (the device tool
# brings back at most 8): summary.json (versions, each step's exit code, seconds and bound, the
# attention path and CUDA graphs of the served stack, test counts, every figure the bench measured
# so far, problems; benchmarks/device/summary.py) and logs.tar.gz (every log, each cut to its last
# 256 KiB); its work folders (logs, junit, the installed wheels: in $TMPDIR, else /tmp) are removed
# when it ends. Its output is one line per step and then the summary, at most 8000 characters, so it
# is within the last 12,000 the tool returns. Exit code 0 only when every step passed, no gpu
# test failed or skipped, and the bench served on Triton with decode CUDA graphs.
#
# On the GPU machine (no package registry), with the wheels made here first:
#   bash scripts/device_wheels.sh
#   run(command="bash scripts/device_check.sh", carry=[".whl", "zerolayer/v1", "zerolayer/kserve"], timeout_s=480)
# A dry run on a CPU machine (CI runs one: tests/benchmarks/test_device_check_script.py): every step
# runs its plumbing and writes the summary; the pytest steps only collect, the bench runs on the
# CPU with the tiny model, and a missing GPU or NVML is not a failure:
#   PYTHON=.venv/bin/python OUT=/tmp/out bash scripts/device_check.sh --dry-run
# DEVICE_CHECK_STEPS=nvml,bench runs only those steps (the others count as not run);
# DEVICE_CHECK_BOUNDS=bench=60,nvml=10 changes bounds (the 420 s budget still holds).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_S=420
RESERVE_S=15
GRACE_S=5
MIN_STEP_S=5
STEPS=(setup versions nvml gpu_unit gpu_stack bench)
declare -A BOUND=([setup]=30 [versions]=25 [nvml]=20 [gpu_unit]=110 [gpu_stack]=95 [bench]=120)
IFS=, read -r -a overrides <<< "${DEVICE_CHECK_BOUNDS:-}"
for setting in "${overrides[@]}"; do BOUND[${setting%%=*}]=${setting#*=}; done
SELECTED=",${DEVICE_CHECK_STEPS:-$(IFS=,; echo "${STEPS[*]}")},"

DRY_RUN=""
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; fi
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/zerolayer-device-check}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zerolayer-device-check-work.XXXXXX")
SITE=$(mktemp -d "${TMPDIR:-/tmp}/zerolayer-site.XXXXXX")
trap 'rm -rf "$WORK" "$SITE"' EXIT
DEVICE=${DEVICE:-cuda:0}
PRESET=${PRESET:-1b}
if [[ -n $DRY_RUN ]]; then DEVICE=cpu PRESET=tiny; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

summary() { "$PY" -m benchmarks.device.summary "$@" --out "$OUT_DIR" --work "$WORK"; }

# step_bound NAME: the step's bound, cut to what is left of the budget (0: none left).
step_bound() {
  local left=$(( START + BUDGET_S - RESERVE_S - GRACE_S - $(date +%s) ))
  local bound=${BOUND[$1]}
  (( bound > left )) && bound=$left
  (( bound < MIN_STEP_S )) && bound=0
  echo "$bound"
}

# run_step NAME BOUND [summary options] -- COMMAND...: runs COMMAND within BOUND seconds, its
# stdout in $WORK/NAME.out and stderr in $WORK/NAME.log, then records the step in the summary.
run_step() {
  local name=$1 bound=$2 options=()
  shift 2
  while [[ $1 != -- ]]; do options+=("$1"); shift; done
  shift
  if [[ $SELECTED != *",$name,"* ]]; then
    summary step "$name" --not-run "not selected (DEVICE_CHECK_STEPS)"
    return
  fi
  if (( bound == 0 )); then
    summary step "$name" --not-run "no time left of the ${BUDGET_S} s budget"
    return
  fi
  local began rc
  began=$(date +%s)
  timeout -k "$GRACE_S" "$bound" "$@" > "$WORK/$name.out" 2> "$WORK/$name.log"
  rc=$?
  summary step "$name" --exit-code "$rc" --seconds $(( $(date +%s) - began )) \
    --bound-s "$bound" "${options[@]}"
}

# pytest_step NAME BOUND PER_TEST_S FILES...: the gpu-marked tests of FILES.
pytest_step() {
  local name=$1 bound=$2 per_test=$3 args
  shift 3
  args=(-m gpu --gpu-strict -p no:cacheprovider -o addopts= --continue-on-collection-errors)
  if [[ -n $DRY_RUN ]]; then
    run_step "$name" "$bound" --collect-only --log "$WORK/$name.out" -- \
      "$PY" -m pytest "${args[@]}" --collect-only -q "$@"
    return
  fi
  args+=(-v --timeout "$per_test" --junitxml "$WORK/$name.xml" --basetemp "$WORK/$name-tmp")
  if [[ $name == gpu_unit ]] && "$PY" -c "import xdist" 2> /dev/null; then
    args+=(-n 4 --dist loadfile)
  fi
  run_step "$name" "$bound" --junit "$WORK/$name.xml" --log "$WORK/$name.out" -- \
    "$PY" -m pytest "${args[@]}" "$@"
}

summary start --budget-s "$BUDGET_S" --steps "$(IFS=,; echo "${STEPS[*]}")" ${DRY_RUN:+--dry-run} \
  || { echo "device check: cannot write the summary in $OUT_DIR"; exit 1; }
echo "device check: work folder $WORK (removed at the end), summary in $OUT_DIR (budget ${BUDGET_S} s)"

run_step setup "$(step_bound setup)" -- bash -c '
  test -f zerolayer/v1/generation_pb2.py \
    || { echo "zerolayer/v1 (generated protobuf code) missing: carry zerolayer/v1 and zerolayer/kserve" >&2; exit 3; }
  if [ -n "$2" ] || ! compgen -G ".whl/*.whl" > /dev/null; then
    echo "no wheels to install"; exit 0
  fi
  "$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$1" .whl/*.whl' "$PY" "$SITE" "${SKIP_WHEELS:-$DRY_RUN}"
if [[ -n $(ls -A "$SITE") ]]; then export PYTHONPATH="$SITE:$PYTHONPATH"; fi

run_step versions "$(step_bound versions)" --json "$WORK/versions.out" -- \
  "$PY" -m benchmarks.device.summary versions

index=${DEVICE#cuda}
index=${index#:}
[[ $index =~ ^[0-9]+$ ]] || index=0
run_step nvml "$(step_bound nvml)" --json "$WORK/nvml.out" -- \
  "$PY" -m zerolayer.scheduler.gpu_health.nvml_check "$index"

mapfile -t gpu_files < <(grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort)
unit_files=() stack_files=()
for file in "${gpu_files[@]}"; do
  if [[ $file == tests/e2e/* ]]; then stack_files+=("$file"); else unit_files+=("$file"); fi
done
pytest_step gpu_unit "$(step_bound gpu_unit)" 60 "${unit_files[@]}"
pytest_step gpu_stack "$(step_bound gpu_stack)" 80 "${stack_files[@]}"

bench_args=(--device "$DEVICE" --preset "$PRESET")
if [[ -n $DRY_RUN ]]; then
  bench_args+=(--requests 4 --prompt-tokens 16 --max-new-tokens 8 --copy-bytes $((16 << 20))
    --kv-cache-bytes $((16 << 20)))
fi
port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
bound=$(step_bound bench)
# The bench's own budget ends 15 s before the step's bound: time to stop its stack and write.
run_step bench "$bound" --json "$WORK/bench.json" -- \
  "$PY" -m benchmarks.device.check "${bench_args[@]}" --port "$port" --budget-s $(( bound > 20 ? bound - 15 : 5 )) \
  --report "$WORK/bench.json" --log-dir "$WORK/bench-logs"

summary finish
