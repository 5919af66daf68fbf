"""The harvesting gateway (``corl serve gateway``): agent apps point their OpenAI ``base_url`` here; each
request goes unchanged to the member its ``model`` names, and its conversation into the run's prompt pool."""

from .app import create_app
from .settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app"]
