"""A sandbox for untrusted programs (the code task's completions): a bubblewrap jail (user, mount, pid,
network, ipc, uts and cgroup namespaces, as nobody) around a process with rlimits, a temporary working
directory and a wall-clock timeout; refused (fail closed) where the jail cannot be built."""

from .jail import SandboxUnavailable, insecure_allowed, require
from .remote import remote_url
from .runner import Limits, SandboxResult, protections, run_python


def require_sandbox(limits: Limits | None = None) -> None:
    """Raise ``SandboxUnavailable`` (naming what is missing) unless code can run here: in the jail, or
    without it because the operator allowed that, or a sandbox service runs them (``CORL_SANDBOX_URL``:
    its own start-up checks its jail). Services that run code call it before serving."""
    if remote_url() is None:
        require((limits or Limits()).uid)


__all__ = [
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "insecure_allowed",
    "protections",
    "require_sandbox",
    "run_python",
]
