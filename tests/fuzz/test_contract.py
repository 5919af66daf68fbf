"""Contract fuzzing: schemathesis (every check, every phase) against the live OpenAPI document of the
model server (tiny model) and of the aggregator (real Redis): 0 server errors, 0 contract failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import FUZZ_CONTEXT
from hooks import CONTEXT_ENV, MODEL_DIR_ENV
from support import run_schemathesis, serve_app

from corl.services.model.app import create_app as create_model_app

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(400)]

ADMIN = "test-admin-token"  # tests/conftest.py server_settings
MAX_EXAMPLES = 20


def test_model_server_contract(server_settings: Any, fuzz_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "weights"
    store.mkdir()
    settings = server_settings.model_copy(update={"model_dir": str(fuzz_model_dir), "weights_root": store})
    with serve_app(create_model_app(settings)) as url:
        env = {MODEL_DIR_ENV: str(fuzz_model_dir), CONTEXT_ENV: str(FUZZ_CONTEXT)}
        run = run_schemathesis(url, {"admin": ADMIN}, tmp_path, MAX_EXAMPLES, env=env)
    print(run.output)
    assert run.returncode == 0, run.output
