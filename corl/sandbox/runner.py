"""Run untrusted Python in a separate, limited process and report what happened.

``run_python(code)`` writes the program into a fresh temporary directory and starts it inside the
jail (``jail.py``: bubblewrap namespaces, as nobody) through ``launcher.py`` (rlimits), with a
wall-clock timeout after which the jail and everything in it is killed. Standard output goes to a
file outside the program's reach, capped by the file-size limit. The result is a ``SandboxResult``;
nothing the program does raises here. Where the jail cannot be built, ``SandboxUnavailable`` is
raised (fail closed) unless the operator allowed the in-process launcher alone. With
``CORL_SANDBOX_URL`` set, programs go to that sandbox service instead (``remote.py``).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from .jail import Jail, require
from .remote import remote_url, run_remote

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


def _command(jail: Jail | None, root: Path, args: dict[str, object]) -> tuple[list[str], Path, int | None]:
    """(argv, cwd, uid to start it as) of one run: in the jail, or the bare launcher (allowed insecure)."""
    if jail is not None:
        argv = [jail.interpreter, "-I", "-S", "/sandbox/launcher.py", "/work", json.dumps({**args, "jailed": True})]
        return jail.command(root, argv), root, jail.run_as()
    work = root / "work"
    return [sys.executable, "-I", "-S", str(LAUNCHER), str(work), json.dumps({**args, "jailed": False})], work, None


def run_python(code: str, limits: Limits | None = None) -> SandboxResult:
    """Run ``code`` as ``main.py`` in the sandbox (this host's jail, or the sandbox service that
    ``CORL_SANDBOX_URL`` names); blocks until it ends (call it from a worker thread). Raises
    ``SandboxUnavailable`` where neither can run it and insecure runs are not allowed."""
    lim = limits or Limits()
    url = remote_url()
    if url is not None:  # a sandbox service runs every program (a host that refuses the jail)
        res = run_remote(url, code, asdict(lim))
        return SandboxResult(res.status, res.returncode, res.stdout, res.stderr, res.seconds)
    return run_here(code, lim)


def run_here(code: str, limits: Limits | None = None) -> SandboxResult:
    """``run_python`` in this host's own jail, whatever ``CORL_SANDBOX_URL`` says (the sandbox service)."""
    lim = limits or Limits()
    jail = require(lim.uid)
    root = Path(tempfile.mkdtemp(prefix="corl-sandbox-"))
    workdir = root / "work"
    try:
        workdir.mkdir()
        (workdir / "main.py").write_text(code)
        shutil.copyfile(LAUNCHER, root / "launcher.py")
        os.chmod(root, 0o755)  # bwrap, started as the sandbox uid, binds from here
        if os.geteuid() == 0:
            os.chown(workdir, lim.uid, lim.uid)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
        args = {k: v for k, v in vars(lim).items() if k != "timeout_s"}
        argv, cwd, user = _command(jail, root, args)
        t0 = time.monotonic()
        with (root / "stdout").open("wb") as out, (root / "stderr").open("wb") as err:
            proc = subprocess.Popen(  # noqa: S603 (argv built here, never from the program)
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: a timeout kills every child too
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
            )
            try:
                rc: int | None = proc.wait(timeout=lim.timeout_s)
                # bwrap reports a child killed by a signal (an rlimit) as 128 + the signal.
                signalled = rc is not None and (rc < 0 or (jail is not None and rc > 128))
                status: Status = "ok" if rc == 0 else ("killed" if signalled else "error")
            except subprocess.TimeoutExpired:
                rc, status = None, "timeout"
            _kill_group(proc)  # also reaps any child the program left behind
        seconds = time.monotonic() - t0
        _log_protections(workdir)
        cap = lim.file_bytes
        return SandboxResult(status, rc, _read(root / "stdout", cap), _read(root / "stderr", 8192), seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


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
        "sandbox protections: isolation=%s network=%s uid=%s rlimits=%s audit_hook=%s",
        info.get("isolation"),
        info.get("network"),
        info.get("uid"),
        info.get("rlimits"),
        info.get("audit_hook"),
    )


def protections(limits: Limits | None = None, here: bool = False) -> dict[str, object]:
    """What is in force where programs run (``here``: in this host's jail), measured by running an
    empty program."""
    lim = limits or Limits()
    res = (run_here if here else run_python)(
        "import json, os; print(json.dumps(json.load(open('protections.json'))))",
        lim,
    )
    return dict(json.loads(res.stdout)) if res.ok else {"error": res.stderr[-500:]}
