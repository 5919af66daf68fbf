"""Fixtures for deployment checks: the repository root, a real helm binary, and chart rendering.

No Docker engine and no cluster exist in CI: the compose file is validated against the compose
spec and against the real CLI and settings classes; the chart is rendered by a real helm binary
and every manifest is validated offline with kubernetes-validate.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import CHART, ROOT


def _find_helm() -> str | None:
    cache = Path(os.environ.get("CORL_HELM_CACHE") or ROOT / ".cache" / "helm")
    for candidate in (os.environ.get("CORL_HELM"), str(cache / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of a real helm binary. Fails (never skips) when there is none: CI runs the fetch script."""
    path = _find_helm()
    if path is None:
        pytest.fail(
            "no helm binary: run `.ci/helm.sh` (caches a static helm v4 under .cache/helm/), "
            "or set CORL_HELM=/path/to/helm"
        )
    out = subprocess.run([path, "version", "--short"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{path} does not run: {out.stderr}"
    return path


Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """``render(values_dict | None, release="t", namespace="corl")`` -> the rendered objects."""
    cache: dict[str, list[dict[str, Any]]] = {}
    tmp = tmp_path_factory.mktemp("helm-values")

    def _render(
        values: dict[str, Any] | None = None, release: str = "t", namespace: str = "corl"
    ) -> list[dict[str, Any]]:
        key = yaml.safe_dump([values, release, namespace])
        if key not in cache:
            args = [helm, "template", release, str(CHART), "--namespace", namespace]
            if values is not None:
                vf = tmp / f"values-{len(cache)}.yaml"
                vf.write_text(yaml.safe_dump(values))
                args += ["--values", str(vf)]
            out = subprocess.run(args, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, f"helm template failed:\n{out.stderr}"
            cache[key] = [d for d in yaml.safe_load_all(out.stdout) if d]
        return copy.deepcopy(cache[key])  # tests may edit what they get

    return _render
