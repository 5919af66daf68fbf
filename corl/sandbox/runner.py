"""Run untrusted Python in a separate, limited process and report what happened.

``run_python(code)`` writes the program into a fresh temporary directory and starts
``launcher.py`` there in a new session (see that module for the protections), with a wall-clock
timeout after which the whole process group is killed. Standard output goes to a file capped by
the file-size limit. The result is a ``SandboxResult``; nothing the program does raises here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launcher.py")
NOBODY = 65534
Status = Literal["ok", "error", "timeout", "killed"]


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 5
    memory_bytes: int = 1 << 30  # address space
    file_bytes: int = 1 << 20  # any file the program writes, its standard output included
    processes: int = 16  # RLIMIT_NPROC of the sandbox uid
    uid: int = NOBODY  # when started as root


@dataclass(frozen=True)
class SandboxResult:
    status: Status  # ok: exit 0; error: non-zero exit; timeout: wall clock; killed: a signal (rlimit)
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_logged = threading.Event()


def _read(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_python(code: str, limits: Limits | None = None) -> SandboxResult:
    """Run ``code`` as ``main.py`` in the sandbox; blocks until it ends (call it from a worker thread)."""
    lim = limits or Limits()
    workdir = Path(tempfile.mkdtemp(prefix="corl-sandbox-"))
    try:
        (workdir / "main.py").write_text(code)
        if os.geteuid() == 0:
            os.chown(workdir, lim.uid, lim.uid)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
        args = {k: v for k, v in vars(lim).items() if k != "timeout_s"}
        t0 = time.monotonic()
        with (workdir / ".stdout").open("wb") as out, (workdir / ".stderr").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER), str(workdir), json.dumps(args)],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: a timeout kills every child too
            )
            try:
                rc: int | None = proc.wait(timeout=lim.timeout_s)
                status: Status = "ok" if rc == 0 else ("killed" if rc is not None and rc < 0 else "error")
            except subprocess.TimeoutExpired:
                rc, status = None, "timeout"
            _kill_group(proc)  # also reaps any child the program left behind
        seconds = time.monotonic() - t0
        _log_protections(workdir)
        cap = lim.file_bytes
        return SandboxResult(status, rc, _read(workdir / ".stdout", cap), _read(workdir / ".stderr", 8192), seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _log_protections(workdir: Path) -> None:
    """Say once per process which protections the sandbox has here (network namespace, uid, ...)."""
    if _logged.is_set():
        return
    try:
        info = json.loads((workdir / "protections.json").read_text())
    except (OSError, ValueError):
        return
    _logged.set()
    log.info(
        "sandbox protections: network=%s uid=%s rlimits=%s audit_hook=%s",
        info.get("network"),
        info.get("uid"),
        info.get("rlimits"),
        info.get("audit_hook"),
    )


def protections(limits: Limits | None = None) -> dict[str, object]:
    """What is in force on this machine, measured by running an empty program."""
    lim = limits or Limits()
    res = run_python(
        "import json, os; print(json.dumps(json.load(open('protections.json'))))",
        lim,
    )
    return dict(json.loads(res.stdout)) if res.ok else {"error": res.stderr[-500:]}
