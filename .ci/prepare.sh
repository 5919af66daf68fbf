#!/usr/bin/env bash
# The slow preparation of CI's later steps, run beside the test suite at the lowest priority (.ci/run
# starts it): the container engine and its images, the vLLM environment's packages, then, once the
# project's .venv is installed, the compose test's CPU image and the tiny cohort its stack serves. Downloads and unpacking mostly, so they
# fill the gaps the tests leave. Best effort: the later steps run the same scripts again, which only
# check what this finished and do what it did not.
set -uo pipefail
cd "$(dirname "$0")/.."
export CI_BACKGROUND=1
say() { echo "[prepare $(date +%T)] $*"; }

bash .ci/container_engine.sh || say "container engine: failed, the compose step does it"
bash .ci/vllm_env.sh || say "vLLM environment: failed, the vLLM step does it"
# The image `pytest -m compose_live` builds first; with its layers cached here, that build is quick.
for _ in $(seq 180); do
  .venv/bin/python -c "import httpx, prometheus_client" 2>/dev/null && break
  sleep 10
done
.venv/bin/python -c "from tests.deploy.live_stack import build_cpu_image; build_cpu_image('podman', '${CORL_IMAGE:-corl:cpu}')" \
  && say "image ${CORL_IMAGE:-corl:cpu} built" || say "image: failed, the compose test builds it"
# The compose step seeds the stack's cohort volume with cohort/tiny: its cohort-init then skips
# building and warming four models inside the stack (most of a cold start).
if [ -f cohort/tiny/cohort.json ] || .venv/bin/corl cohort init --preset tiny --out cohort/tiny; then
  say "cohort/tiny ready"
else
  say "cohort/tiny: failed, the stack's cohort-init builds it"
fi
