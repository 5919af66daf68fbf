"""Helpers of the e2e tests (no tests here): ``corl`` commands as real processes, and the processes
a run leaves behind."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psutil
import redis
import yaml

from corl.embedded.processes import corl_command
from corl.health import running, wait_healthy


def corl(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(corl_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def leftovers(*markers: Path) -> list[dict]:
    """Processes whose command line or working directory mentions a marker: every child of a run names
    its run directory (aggregator, trainers, the servers' weights store) or the cohort directory
    (servers); Redis rewrites its command line but works in the run's ``redis`` folder."""
    return [
        p.info
        for p in psutil.process_iter(["pid", "cmdline", "cwd", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE
        and any(str(m) in part for m in markers for part in [*(p.info["cmdline"] or []), p.info["cwd"] or ""])
    ]


def wait_snapshots(run_dir: Path, n: int, timeout_s: float = 120.0) -> None:
    history, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout_s
    while len(history.read_text().splitlines()) < n:
        assert time.monotonic() < deadline, f"fewer than {n} snapshots in {timeout_s}s"
        time.sleep(0.2)


def start_run(cohort: Path, run_dir: Path, rounds: int, *extra: str) -> subprocess.Popen[str]:
    """``corl run`` in the background (self_vote rewards), returned once its first snapshot is written."""
    proc = subprocess.Popen(
        corl_command(
            "run",
            "--cohort",
            str(cohort),
            "--rounds",
            str(rounds),
            "--out",
            str(run_dir),
            "--reward",
            "self_vote",
            *extra,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    history = run_dir / "metrics.jsonl"
    while not (history.exists() and history.read_text().strip()):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "corl run did not get its services healthy"
        time.sleep(0.5)
    return proc


def run_state(run_dir: Path, key: str, field: str) -> int:
    """An integer field of a hash in the run's own Redis (0 while it is missing or Redis does not answer)."""
    url = yaml.safe_load((run_dir / "cohort.yaml").read_text())["redis_url"]
    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        return int(client.hget(key, field) or 0)
    except redis.RedisError:
        return 0
    finally:
        client.close()


def published_versions(log: Path, member: str) -> list[int]:
    """Versions the member's trainer published, in order, over every start (the log is appended)."""
    return [int(v) for v in re.findall(rf"published {member} version (\d+)", log.read_text())]


def wait_ready(url: str, proc: subprocess.Popen[str], timeout_s: float = 300.0) -> None:
    """``url``'s ``/readyz`` answers 200; fails at once, with ``proc``'s output, if ``proc`` exits."""
    wait_healthy(f"{url}/readyz", timeout_s, alive=running(proc, lambda: proc.stdout.read() if proc.stdout else ""))
