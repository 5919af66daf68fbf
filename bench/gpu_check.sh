#!/usr/bin/env bash
# corl's GPU path, on a machine with NVIDIA GPUs, in one go:
#
#   bash bench/gpu_check.sh                 # from anywhere; work goes to .cache/gpu-check/
#
#   1. install: a venv (.venv-gpu) with CUDA torch, vLLM and corl[dev]; torch must see the GPUs;
#   2. the vLLM backend tests (tests/vllm_backend, marker vllm) on the GPU;
#   3. a real member from the Hugging Face Hub (CORL_GPU_MODEL), pinned with `corl cohort init --from-hub`,
#      and on it the serving bench (bench/vllm_backend.py: vLLM tokens/s and weight swap vs transformers;
#      bench/serving.py: HTTP overhead, concurrency, swap);
#   4. a short real-cohort run (CORL_GPU_CONFIG cut down by bench/gpu_check.py, CORL_GPU_ROUNDS rounds)
#      with the planned placement: `corl plan`, then `corl run`, checked for its rounds, trained versions,
#      hub pins and device plan;
#   5. with 2 GPUs or more: a trainer group of 2 ranks over NCCL against one GPU (tests/gpu, marker gpu).
#
# Every step prints `RESULT step=... status=pass|fail|skip ...` (the benches' own RESULT lines follow,
# prefixed with the step) and appends it to .cache/gpu-check/results.txt; logs are beside it. The script
# exits non-zero when any step failed, and 0, saying so, on a machine without a CUDA device.
#
# Environment: CORL_GPU_CHECK_DIR (work folder), CORL_GPU_VENV (.venv-gpu), VLLM_SPEC (vllm==0.32.0, the
# version .ci/vllm_env.sh pins for CPU), CORL_GPU_MODEL (HuggingFaceTB/SmolLM2-360M-Instruct),
# CORL_GPU_CONFIG (examples/gpu-node.yaml), CORL_GPU_ROUNDS (3), HF_HOME / HF_TOKEN / HF_HUB_OFFLINE as
# usual; CORL_GPU_CHECK_DRY_RUN=1 prints each step's command instead of running it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
WORK="${CORL_GPU_CHECK_DIR:-$ROOT/.cache/gpu-check}"
VENV="${CORL_GPU_VENV:-$ROOT/.venv-gpu}"
VLLM_SPEC="${VLLM_SPEC:-vllm==0.32.0}"
TORCH_SPEC="torch==2.13.0"
MODEL="${CORL_GPU_MODEL:-HuggingFaceTB/SmolLM2-360M-Instruct}"
CONFIG="${CORL_GPU_CONFIG:-$ROOT/examples/gpu-node.yaml}"
ROUNDS="${CORL_GPU_ROUNDS:-3}"
DRY="${CORL_GPU_CHECK_DRY_RUN:-0}"
PY="$VENV/bin/python"
FAILURES=0

mkdir -p "$WORK"
: >"$WORK/results.txt"

result() {
  echo "RESULT $*"
  echo "RESULT $*" >>"$WORK/results.txt"
}

gpu_count() {
  command -v nvidia-smi >/dev/null 2>&1 || { echo 0; return; }
  nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
}

# step NAME COMMAND...: run it with its output in $WORK/NAME.log; its RESULT lines are repeated with the
# step's name; a failure is counted and the log's tail shown.
step() {
  local name="$1"
  shift
  local log="$WORK/$name.log" start rc
  echo "=== $name: $*"
  if [ "$DRY" = "1" ]; then
    result "step=$name status=dry-run command=$(printf '%q ' "$@")"
    return 0
  fi
  start=$(date +%s)
  "$@" >"$log" 2>&1
  rc=$?
  grep '^RESULT ' "$log" | sed "s/^RESULT /RESULT step=$name /" | while IFS= read -r line; do
    echo "$line"
    echo "$line" >>"$WORK/results.txt"
  done
  if [ "$rc" -eq 0 ]; then
    result "step=$name status=pass seconds=$(($(date +%s) - start))"
  else
    FAILURES=$((FAILURES + 1))
    result "step=$name status=fail exit=$rc seconds=$(($(date +%s) - start)) log=$log"
    tail -n 40 "$log"
  fi
  return "$rc"
}

GPUS=$(gpu_count)
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "gpu_check: no CUDA device on this machine (nvidia-smi lists none): nothing to check here; skipped."
  result "gpu_check status=skipped reason=no-cuda-device"
  exit 0
fi
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' ' '_')
echo "gpu_check: $GPUS GPU(s) ($DEVICE); work in $WORK"

install() {
  [ -x "$PY" ] || python3 -m venv "$VENV" || return 1
  "$PY" -m pip install --disable-pip-version-check --upgrade pip wheel || return 1
  "$PY" -m pip install --disable-pip-version-check "$TORCH_SPEC" "$VLLM_SPEC" -e "${ROOT}[dev]" || return 1
  "$PY" - <<'PY'
import torch, vllm  # noqa: F401
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"
print(f"RESULT torch={torch.__version__} cuda={torch.version.cuda} vllm={vllm.__version__} gpus={torch.cuda.device_count()}")
PY
}

step install install || { result "gpu_check status=fail failures=$FAILURES gpus=$GPUS device=$DEVICE"; exit 1; }
step vllm_tests "$PY" -m pytest -m vllm tests/vllm_backend -p no:cacheprovider -q
if step member "$VENV/bin/corl" cohort init --from-hub "$MODEL=member" --out "$WORK/member"; then
  step bench_vllm "$PY" bench/vllm_backend.py --model "$WORK/member/member"
  step bench_serving "$PY" bench/serving.py --model "$WORK/member/member"
else
  result "step=bench_vllm status=skip reason=no-member"
  result "step=bench_serving status=skip reason=no-member"
fi
if step config "$PY" bench/gpu_check.py config "$CONFIG" "$WORK/cohort.yaml" "$GPUS"; then
  step plan "$VENV/bin/corl" plan --config "$WORK/cohort.yaml"
  rm -rf "$WORK/run"
  step cohort_run "$VENV/bin/corl" run --config "$WORK/cohort.yaml" --rounds "$ROUNDS" --eval-every 1000 \
    --out "$WORK/run" && step cohort_run_check "$PY" bench/gpu_check.py check-run "$WORK/run" "$ROUNDS"
fi
if [ "$GPUS" -ge 2 ]; then
  step nccl_group "$PY" -m pytest -m gpu tests/gpu -p no:cacheprovider -q -s
else
  result "step=nccl_group status=skip reason=one-gpu"
fi

STATUS=pass
[ "$FAILURES" -eq 0 ] || STATUS=fail
[ "$DRY" = "1" ] && STATUS=dry-run
result "gpu_check status=$STATUS failures=$FAILURES gpus=$GPUS device=$DEVICE"
echo "figures: $WORK/results.txt (docs/SCALING.md quotes them)"
[ "$FAILURES" -eq 0 ]
