#!/usr/bin/env bash
# The slow preparation of CI's later steps, run beside the test suite at the lowest priority (.ci/run
# starts it): the container engine and its images, the vLLM environment's packages, then, once the
# project's .venv is installed, the compose test's CPU image and the tiny cohort its stack serves.
# Downloads and unpacking mostly, so they fill the gaps the tests leave. Best effort: the later steps
# run the same scripts again, which only check what this finished and do what it did not. When .ci/run
# ends early (a failed step), it leaves .cache/ci-stopped and this stops before its next step.
set -uo pipefail
cd "$(dirname "$0")/.."
export CI_BACKGROUND=1
say() { echo "[prepare $(date +%T)] $*"; }
go_on() { [ ! -e .cache/ci-stopped ] || { say "CI ended: stopping"; exit 0; }; }

go_on
bash .ci/container_engine.sh || say "container engine: failed, the compose step does it"
go_on
bash .ci/vllm_env.sh || say "vLLM environment: failed, the vLLM step does it"
# The README's install is done once its last package, the project, has its script.
until [ -x .venv/bin/corl ] && .venv/bin/python -c "import httpx, prometheus_client, pytest" 2>/dev/null; do
  go_on
  sleep 10
done
# The image `pytest -m compose_live` builds first; with its layers cached here, that build is quick.
.venv/bin/python -c "from tests.deploy.live_stack import build_cpu_image; build_cpu_image('podman', '${CORL_IMAGE:-corl:cpu}')" \
  && say "image ${CORL_IMAGE:-corl:cpu} built" || say "image: failed, the compose test builds it"
go_on
# The compose step seeds the stack's cohort volume with cohort/tiny: its cohort-init then skips
# building and warming four models inside the stack (most of a cold start).
if [ -f cohort/tiny/cohort.json ] || .venv/bin/corl cohort init --preset tiny --out cohort/tiny; then
  say "cohort/tiny ready"
else
  say "cohort/tiny: failed, the stack's cohort-init builds it"
fi
