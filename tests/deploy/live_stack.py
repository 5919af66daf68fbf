"""The compose stack under a real container engine, for the ``compose_live`` tests.

``LiveStack`` drives ``podman-compose`` (or ``docker compose``) over docker-compose.yml as it is,
plus ``.ci/compose.offline.yml`` where Docker Hub is unreachable, and reads the running services
over HTTP at their container addresses (rootful bridge networks are routable from the host).
Podman 4.3 without systemd runs no health-check timers, so ``tick_health`` runs the compose
health checks itself; nothing else about the stack is changed for the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .support import COMPOSE_FILE, ROOT, user_env

OFFLINE_OVERRIDE = ROOT / ".ci" / "compose.offline.yml"
OFFLINE_BASE = "localhost/debian:bookworm-py"
OFFLINE_IMAGES = ("localhost/corl-redis:7", "localhost/corl-prometheus:2")
GRAFANA_IMAGE = "grafana/grafana:12.1.0"


def run(argv: list[str], timeout: float = 120, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def engine_binaries() -> tuple[str, list[str]] | None:
    """(engine, compose argv prefix): podman + podman-compose, else docker + `docker compose`."""
    if shutil.which("podman") and shutil.which("podman-compose"):
        return "podman", ["podman-compose"]
    if shutil.which("docker"):
        return "docker", ["docker", "compose"]
    return None


def image_exists(engine: str, ref: str) -> bool:
    return run([engine, "image", "inspect", ref], check=False, timeout=60).returncode == 0


def pip_find_links() -> Path | None:
    """The host's local wheel folder (pip's find-links), where the CPU torch wheel lies offline."""
    value = (
        os.environ.get("PIP_FIND_LINKS")
        or run(["pip", "config", "get", "global.find-links"], check=False, timeout=60).stdout.strip()
    )
    path = Path(value.split()[0]) if value else None
    return path if path is not None and path.is_dir() else None


def build_cpu_image(engine: str, tag: str) -> list[str]:
    """Build docker/Dockerfile (VARIANT=cpu). Defaults as a user gets them; on a machine prepared by
    .ci/container_engine.sh: the local base, the host's CA bundle and wheel folder."""
    argv = [engine, "build", "-f", "docker/Dockerfile", "-t", tag, "--build-arg", "VARIANT=cpu"]
    if engine == "podman" and image_exists(engine, OFFLINE_BASE):
        argv += ["--network", "host", "--build-arg", f"BASE_IMAGE={OFFLINE_BASE}"]
        if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
            argv += ["-v", "/etc/ssl/certs:/host-certs:ro", "--build-arg", "CA_BUNDLE=/host-certs/ca-certificates.crt"]
        wheels = pip_find_links()
        if wheels is not None:
            argv += [
                "-v",
                f"{wheels}:/wheels:ro",
                "--build-arg",
                "WHEELS_DIR=/wheels",
                "--build-arg",
                "TORCH_INDEX_URL=",
            ]
    argv.append(".")
    run(argv, timeout=1500, cwd=ROOT)
    return argv


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One /metrics page as {(sample name, sorted labels): value}."""
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def metric(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    for (n, lab), v in page.items():
        if n == name and all(dict(lab).get(k) == w for k, w in labels.items()):
            return v
    return None


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 3.0) -> Any:
    """Poll ``check()`` until it returns a truthy value; the last error or value explains a timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except (httpx.HTTPError, OSError, KeyError, ValueError, AssertionError) as err:
            last = err
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


@dataclass
class LiveStack:
    engine: str
    compose_cmd: list[str]
    project: str
    env_file: Path
    offline: bool
    env: dict[str, str] = field(default_factory=dict)  # the compose command's process environment
    env_values: dict[str, str] = field(default_factory=dict)  # what the .env file says
    timings: dict[str, float] = field(default_factory=dict)
    _ticker: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    # --- compose ---------------------------------------------------------------------------------
    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = ["-f", str(COMPOSE_FILE)] + (["-f", str(OFFLINE_OVERRIDE)] if self.offline else [])
        argv = [*self.compose_cmd, "-p", self.project, *files, "--env-file", str(self.env_file), *args]
        return run(argv, timeout=timeout, check=check, cwd=ROOT, env={**os.environ, **self.env})

    def up(self, timeout: float = 2400) -> None:
        """`up -d`. With podman, in two steps: podman-compose turns `depends_on` into `--requires`,
        and podman (4.3) then refuses to restart a crashed container whose required one-shot
        `cohort-init` has exited, which defeats `restart: unless-stopped`. So cohort-init runs
        first (to completion, as `service_completed_successfully` asks), then the rest with
        `--no-deps` (no `--requires`; podman-compose < podman 4.6 ignores `service_healthy` anyway)."""
        if self.engine != "podman":
            self.compose("up", "-d", "--no-build", timeout=timeout)
            return
        self.compose("up", "-d", "--no-build", "cohort-init", timeout=300)
        code = run([self.engine, "wait", f"{self.project}_cohort-init_1"], timeout=timeout).stdout.strip()
        assert code == "0", f"cohort-init exited with {code}"
        self.compose("up", "-d", "--no-build", "--no-deps", timeout=900)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - t0, 1)
            print(f"[compose_live] {name}: {self.timings[name]:.1f}s", flush=True)

    # --- containers ------------------------------------------------------------------------------
    def containers(self, all_states: bool = False) -> list[dict[str, Any]]:
        argv = [self.engine, "ps", "--format", "json", "--filter", f"label=com.docker.compose.project={self.project}"]
        if all_states:
            argv.insert(2, "-a")
        out = run(argv, timeout=60).stdout.strip()
        if not out:
            return []
        rows = json.loads(out) if out.startswith("[") else [json.loads(line) for line in out.splitlines()]
        return rows

    def container_of(self, service: str) -> str:
        for row in self.containers():
            labels = row.get("Labels") or {}
            if labels.get("com.docker.compose.service") == service:
                names = row["Names"]
                return names[0] if isinstance(names, list) else names
        raise KeyError(f"no running container for {service}")

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(run([self.engine, "inspect", container], timeout=60).stdout)[0]

    def address(self, service: str) -> str:
        nets = self.inspect(self.container_of(service))["NetworkSettings"]["Networks"]
        ip = next(n["IPAddress"] for n in nets.values() if n.get("IPAddress"))
        return str(ip)

    def url(self, service: str, port: int, path: str) -> str:
        return f"http://{self.address(service)}:{port}{path}"

    def health(self, service: str) -> str:
        state = self.inspect(self.container_of(service))["State"]
        health = state.get("Health") or state.get("Healthcheck") or {}
        return str(health.get("Status", "none"))

    # --- health checks ---------------------------------------------------------------------------
    def tick_health(self, interval_s: float = 10.0) -> None:
        """Run every container's health check every ``interval_s`` (podman's timers need systemd)."""
        if self.engine != "podman" or self._ticker is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                with contextlib.suppress(Exception):
                    for row in self.containers():
                        if row.get("State") == "running":
                            name = row["Names"][0] if isinstance(row["Names"], list) else row["Names"]
                            run([self.engine, "healthcheck", "run", name], check=False, timeout=30)

        self._stop.clear()
        self._ticker = threading.Thread(target=loop, name="health-ticker", daemon=True)
        self._ticker.start()

    def stop_ticking(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=60)
        self._ticker = None

    def wait_all_healthy(self, services: list[str], timeout_s: float) -> None:
        def all_healthy() -> bool:
            states = {s: self.health(s) for s in services}
            bad = {s: h for s, h in states.items() if h != "healthy"}
            if bad:
                raise AssertionError(f"not healthy yet: {bad}")
            return True

        wait_for("every health check", all_healthy, timeout_s, interval_s=5)

    # --- state of the run ------------------------------------------------------------------------
    def aggregator_round(self) -> int:
        page = metrics(self.url("aggregator", 8100, "/metrics"))
        return int(metric(page, "corl_aggregator_round") or 0)

    def rounds_ok(self) -> int:
        page = metrics(self.url("aggregator", 8100, "/metrics"))
        return int(metric(page, "corl_aggregator_rounds_total", status="ok") or 0)

    def trainer(self, member: str) -> dict[str, float]:
        page = metrics(self.url(f"trainer-{member}", 9100, "/metrics"))
        names = (
            "corl_trainer_step",
            "corl_trainer_weight_version",
            "corl_trainer_publishes_total",
            "corl_trainer_duplicate_batches_total",
            "corl_trainer_batches_applied_total",
        )
        return {n: float(metric(page, n, member=member) or 0) for n in names}

    def server_version(self, member: str) -> int:
        info = httpx.get(self.url(f"model-{member}", 8000, "/v1/info"), timeout=10).json()
        return int(info["weight_version"])

    def server_swaps(self, member: str) -> int:
        page = metrics(self.url(f"model-{member}", 8000, "/metrics"))
        return int(
            sum(
                v
                for (n, lab), v in page.items()
                if n == "corl_server_weight_updates_total" and dict(lab).get("result") == "ok"
            )
        )

    def volume_dir(self, volume: str) -> Path:
        out = run([self.engine, "volume", "inspect", f"{self.project}_{volume}"], timeout=60).stdout
        return Path(json.loads(out)[0]["Mountpoint"])

    def seed_cohort(self, source: Path) -> None:
        """Put an already built cohort in the ``cohort`` volume before ``up``: cohort-init then
        takes its skip path instead of warming up four models (most of a cold start on 2 cores)."""
        # The labels compose sets on its own volumes, so that `down -v` removes this one too.
        labels = [f"--label={k}={self.project}" for k in ("io.podman.compose.project", "com.docker.compose.project")]
        run(
            [
                self.engine,
                "volume",
                "create",
                *labels,
                "--label=com.docker.compose.volume=cohort",
                f"{self.project}_cohort",
            ],
            timeout=60,
        )
        dest = self.volume_dir("cohort")
        shutil.copytree(source, dest, dirs_exist_ok=True)
        for path in (dest, *dest.rglob("*")):
            os.chown(path, 10001, 10001)

    def checkpoint_state(self, member: str) -> dict[str, Any] | None:
        """The newest complete checkpoint's trainer_state.json on the checkpoints volume."""
        root = self.volume_dir("checkpoints") / member
        done = sorted(
            (p for p in root.glob("step-*") if (p / "trainer_state.json").exists()),
            key=lambda p: int(p.name.split("-", 1)[1]),
        )
        return json.loads((done[-1] / "trainer_state.json").read_text()) if done else None


def make_env_file(path: Path, agg_port: int, prom_port: int, graf_port: int) -> dict[str, str]:
    """The user's `cp .env.example .env` with the secrets set and free host ports."""
    env = user_env()
    env.update(
        CORL_AGGREGATOR_HOST_PORT=str(agg_port),
        PROMETHEUS_HOST_PORT=str(prom_port),
        GRAFANA_HOST_PORT=str(graf_port),
    )
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return env
