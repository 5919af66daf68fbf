"""The e2e tests' cohort: the ``micro`` preset, built once per session by ``corl cohort init``."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_processes import corl


@pytest.fixture(scope="session")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e2e") / "cohort"
    built = corl(
        "cohort", "init", "--preset", "micro", "--out", str(out), "--max-steps", "150", cwd=out.parent, timeout=300
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out
