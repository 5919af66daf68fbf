"""The aggregator's uvicorn server: a stop signal halts the rounds at once."""

from __future__ import annotations

from types import FrameType

import uvicorn


class RoundsHaltingServer(uvicorn.Server):
    """uvicorn, but SIGTERM / Ctrl-C stops the rounds at once: uvicorn finishes the open requests
    before the app's shutdown, and a stopped run must not go on producing rounds meanwhile."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self.config.app, "state", None)  # the FastAPI app given (not an import string)
        serving = getattr(state, "serving", None)
        if serving is not None:
            serving.halt_rounds()
        super().handle_exit(sig, frame)
