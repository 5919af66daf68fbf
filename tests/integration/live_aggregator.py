"""An aggregator app served by uvicorn on a loopback port, in a thread: for clients that need a real
socket (headless Chromium, ``requests`` as OpenRLHF posts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from corl.redis_server import free_port


@contextmanager
def serve(app: FastAPI, ready_timeout_s: float = 30.0) -> Iterator[str]:
    """Yield the base URL once ``/readyz`` answers 200; stop the server on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the aggregator on {url} did not get ready")
            time.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
