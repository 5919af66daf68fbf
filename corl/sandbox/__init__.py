"""A sandbox for untrusted programs (the code task's completions): a separate process with
rlimits, no network, an unprivileged uid, a temporary working directory and a wall-clock timeout."""

from .runner import Limits, SandboxResult, protections, run_python

__all__ = ["Limits", "SandboxResult", "protections", "run_python"]
