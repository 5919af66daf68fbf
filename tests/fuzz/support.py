"""Serving an app on a loopback port and running the schemathesis CLI against its live OpenAPI document."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HOOKS = "hooks"  # tests/fuzz/hooks.py, importable with this folder on PYTHONPATH
FUZZ_CONTEXT = 512  # the fuzzed model's context: room for long prompts (conftest.fuzz_model_dir)


@dataclass
class FuzzRun:
    returncode: int
    output: str
    seconds: float


def run_schemathesis(
    url: str,
    tokens: dict[str, str],
    workdir: Path,
    max_examples: int,
    *,
    seed: int = 0,
    env: dict[str, str] | None = None,
    extra_config: str = "",
) -> FuzzRun:
    """``schemathesis run`` on ``url``/openapi.json, every check and phase, with a bearer token per
    OpenAPI security scheme (``tokens``: scheme name -> token); ``env`` reaches the hooks."""
    config = workdir / "schemathesis.toml"
    auth = "".join(f'[auth.openapi.{name}]\nbearer = "{token}"\n' for name, token in tokens.items())
    config.write_text(auth + extra_config)
    cli = Path(sys.executable).parent / "schemathesis"
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **(env or {}), "SCHEMATHESIS_HOOKS": HOOKS, "PYTHONPATH": path}
    cmd = [
        str(cli),
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--suppress-health-check",
        "too_slow",
        "--output-truncate",
        "false",
    ]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)  # noqa: S603
    return FuzzRun(done.returncode, done.stdout + done.stderr, time.monotonic() - t0)
