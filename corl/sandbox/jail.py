"""The isolation boundary: bubblewrap (``bwrap``) namespaces around every untrusted program.

The program runs in new user, mount, pid, network, ipc, uts and cgroup namespaces, as the host's
unprivileged ``nobody`` (bwrap is started as that uid, so the sandbox's own uid maps to nobody, never
to root), with every capability dropped and no new privileges. Its filesystem is a fresh root: the
system's ``/usr`` (read-only; the system interpreter runs the program), its own working directory
(the only writable place besides a private ``/tmp``), its own ``/proc`` (it sees only its own
processes: not the service's environment, nor any other process) and a minimal ``/dev``. No host
network, no sockets anywhere but its own loopback. When the pid namespace's first process dies, the
kernel kills everything the program started.

An in-process check (the launcher's audit hook) cannot be the boundary: the program shares its
interpreter. Where this jail cannot be built (no ``bwrap``, or a host that refuses user namespaces:
Docker's and Kubernetes' default seccomp profiles refuse ``unshare`` to a container without
CAP_SYS_ADMIN), code is refused (``SandboxUnavailable``) unless the operator allows the weaker
launcher with ``CORL_SANDBOX_ALLOW_INSECURE=1`` (the config's ``sandbox.allow_insecure``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The jail binds only /usr: programs run with a system interpreter under it (its files are readable by
# nobody; a venv's interpreter under /root is not), the distribution's or an image's /usr/local one.
INTERPRETERS = ("/usr/bin/python3", "/usr/local/bin/python3")
NAMESPACES = ("user", "mount", "pid", "network", "ipc", "uts", "cgroup")
ALLOW_INSECURE_ENV = "CORL_SANDBOX_ALLOW_INSECURE"


class SandboxUnavailable(RuntimeError):
    """The isolation boundary is not in force here, and the operator did not allow running without it."""


@dataclass(frozen=True)
class Jail:
    bwrap: str
    interpreter: str
    uid: int

    def command(self, root: Path, argv: list[str]) -> list[str]:
        """bwrap's command line: ``root/work`` is the program's writable directory (``/work`` inside),
        ``root/launcher.py`` its read-only first stage (``/sandbox/launcher.py``)."""
        cmd = [
            self.bwrap,
            "--unshare-user",  # required, not "-try": the uid map is what keeps root out
            "--disable-userns",  # and the program cannot make another one
            "--unshare-all",  # mount, pid, network, ipc, uts, cgroup
            "--die-with-parent",
            "--new-session",  # no TIOCSTI into a terminal it does not own
            "--cap-drop", "ALL",
            "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for link in ("bin", "lib", "lib64", "sbin"):  # merged-/usr systems: /lib -> usr/lib
            target = Path("/") / link
            if target.is_symlink():
                cmd += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.is_dir():
                cmd += ["--ro-bind", str(target), f"/{link}"]
        cmd += [
            "--ro-bind", str(root / "launcher.py"), "/sandbox/launcher.py",
            "--bind", str(root / "work"), "/work",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            "--chdir", "/work",
            "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "HOME", "/work",
            "--setenv", "TMPDIR", "/tmp",
            "--setenv", "LANG", "C.UTF-8",
            "--",
            *argv,
        ]  # fmt: skip
        return cmd

    def run_as(self) -> int | None:
        """The uid bwrap itself is started as: the unprivileged one when we are root (so nothing in the
        jail maps to root); None (our own) otherwise."""
        return self.uid if os.geteuid() == 0 else None


def insecure_allowed() -> bool:
    return os.environ.get(ALLOW_INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=4)
def probe(uid: int) -> tuple[Jail | None, str]:
    """The jail, if one can be built here, and what is missing otherwise (measured by running
    ``true``-like code inside it once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    interpreter = next((os.path.realpath(p) for p in INTERPRETERS if os.access(p, os.X_OK)), None)
    if interpreter is None or not interpreter.startswith("/usr/"):
        return None, f"no Python under /usr for the jail to run programs with (looked for {', '.join(INTERPRETERS)})"
    jail = Jail(bwrap, interpreter, uid)
    root = Path(tempfile.mkdtemp(prefix="corl-jail-probe-"))
    try:
        (root / "work").mkdir()
        (root / "launcher.py").write_text("")
        os.chmod(root, 0o755)
        if os.geteuid() == 0:
            os.chown(root / "work", uid, uid)
        try:
            out = subprocess.run(
                jail.command(root, [interpreter, "-I", "-S", "-c", "import os; print(os.getuid())"]),
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
                user=jail.run_as(),
                group=jail.run_as(),
                extra_groups=[] if jail.run_as() is not None else None,
            )
        except (OSError, subprocess.SubprocessError) as err:
            return None, f"bwrap could not start: {err}"
        if out.returncode != 0:
            reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
            return None, f"this host refuses the namespaces the jail needs ({reason})"
        return jail, ""
    finally:
        shutil.rmtree(root, ignore_errors=True)


def require(uid: int) -> Jail | None:
    """The jail; None when it is missing and the operator allowed the insecure launcher; else raises
    ``SandboxUnavailable`` naming what is missing."""
    jail, missing = probe(uid)
    if jail is not None:
        return jail
    if insecure_allowed():
        return None
    raise SandboxUnavailable(
        f"refusing to run untrusted code: {missing}. Install bubblewrap and allow user namespaces, run "
        f"code in the sandbox service, or set {ALLOW_INSECURE_ENV}=1 (sandbox.allow_insecure: true) to accept "
        "the in-process launcher, which a hostile program can escape"
    )
