"""The cohort config's ``sandbox`` section: where untrusted programs (the code task's) may run."""

from __future__ import annotations

from pydantic import Field

from corl.sandbox.jail import ALLOW_INSECURE_ENV

from .base import _Section


class SandboxConfig(_Section):
    allow_insecure: bool = Field(
        default=False,
        description="Run programs with the in-process launcher alone where the bubblewrap jail cannot be built "
        "(no bwrap, or a host that refuses user namespaces). A hostile program can escape it: refused by default.",
    )

    def env(self) -> dict[str, str]:
        """What every process corl starts needs to know of it (``corl.sandbox.jail`` reads it)."""
        return {ALLOW_INSECURE_ENV: "1"} if self.allow_insecure else {}
