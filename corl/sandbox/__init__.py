"""A sandbox for untrusted programs (the code task's completions): a bubblewrap jail (user, mount, pid,
network, ipc, uts and cgroup namespaces, as nobody) around a process with rlimits, a temporary working
directory and a wall-clock timeout; refused (fail closed) where the jail cannot be built."""

from .jail import SandboxUnavailable, insecure_allowed, require
from .runner import Limits, SandboxResult, protections, run_python


def require_sandbox(limits: Limits | None = None) -> None:
    """Raise ``SandboxUnavailable`` (naming what is missing) unless code can run here: in the jail, or
    without it because the operator allowed that. Services that run code call it before serving."""
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
