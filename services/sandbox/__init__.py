"""The sandbox service (``corl serve sandbox``): runs untrusted programs for services whose host refuses
the jail's namespaces."""

from .app import create_app
from .settings import SandboxSettings

__all__ = ["SandboxSettings", "create_app"]
