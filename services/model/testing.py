"""Run a model server on a free loopback port, for tests and benchmarks of any service.

    from corl.services.model.testing import running_server
    with running_server(ServerSettings(model_dir=str(d), admin_token="t", num_threads=1)) as url:
        httpx.post(f"{url}/v1/generate", json={"prompts": ["12+34="]})

The server is a real uvicorn in a background thread of this process (its own event loop);
``running_server`` returns once ``/readyz`` answers 200, and stops the server on exit.
For a separate process instead, run ``corl serve model --model DIR --port P``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import uvicorn
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from .app import create_app
from .backends.base import Backend
from .settings import ServerSettings


class _NotReady(Exception):
    pass


@contextlib.contextmanager
def running_server(
    settings: ServerSettings, backend: Backend | None = None, *, ready_timeout_s: float = 120.0
) -> Iterator[str]:
    """Serve ``create_app(settings, backend)`` on 127.0.0.1:<free port>; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings, backend), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for attempt in Retrying(
            stop=stop_after_delay(ready_timeout_s),
            wait=wait_fixed(0.05),
            retry=retry_if_exception_type((httpx.TransportError, _NotReady)),
            reraise=True,
        ):
            with attempt:
                if not thread.is_alive():
                    raise RuntimeError("model server thread exited during startup")
                if httpx.get(f"{url}/readyz", timeout=5.0).status_code != 200:
                    raise _NotReady(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
