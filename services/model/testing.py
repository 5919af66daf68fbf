"""Run a model server on a free loopback port, and a scriptable fake backend, for tests and
benchmarks of any service.

    from corl.services.model.testing import running_server
    with running_server(ServerSettings(model_dir=str(d), admin_token="t", num_threads=1)) as url:
        httpx.post(f"{url}/v1/generate", json={"prompts": ["12+34="]})

The server is a real uvicorn in a background thread of this process (its own event loop);
``running_server`` returns once ``/readyz`` answers 200, and stops the server on exit.
For a separate process instead, run ``corl serve model --model DIR --port P``.

``FakeBackend`` answers from a script instead of a model, records the texts it was given, and can
be made slow, failing or hanging: the serving layer and everything above it run for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import uvicorn

from corl.health import wait_healthy

from .app import create_app
from .backends.base import Backend, Completion, GenerateOutput, JudgeOutput, PromptOutput, SamplingParams, WeightFormat
from .settings import ServerSettings


@contextlib.contextmanager
def serve_app(app: Any, ready_path: str = "/readyz", timeout_s: float = 120.0) -> Iterator[str]:
    """Serve an ASGI ``app`` with uvicorn on 127.0.0.1:<free port> in a thread; yield its base URL once
    ``ready_path`` answers 200."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def alive() -> None:
        if not thread.is_alive():
            raise RuntimeError("server thread exited during startup")

    try:
        wait_healthy(f"{url}{ready_path}", timeout_s, alive=alive, interval_s=0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextlib.contextmanager
def running_server(
    settings: ServerSettings, backend: Backend | None = None, *, ready_timeout_s: float = 120.0
) -> Iterator[str]:
    """Serve ``create_app(settings, backend)`` on 127.0.0.1:<free port>; yield its base URL."""
    with serve_app(create_app(settings, backend), timeout_s=ready_timeout_s) as url:
        yield url


class FakeBackend(Backend):
    """Answers every prompt with ``answers`` (cycled; or ``answer(text)``), judges every text 0.25, and
    records what it was given (``generated``: rendered prompts, ``judged``: rendered judge texts)."""

    kind = "fake"

    def __init__(
        self,
        answers: Sequence[str] = ("46",),
        *,
        name: str = "fake",
        tokenizer: Any = None,
        answer: Callable[[str], str] | None = None,
        fail: bool = False,
        hang: bool = False,
    ) -> None:
        super().__init__("unused", name)
        self.tokenizer = tokenizer
        self.answers, self.answer, self.fail, self.hang = list(answers), answer, fail, hang
        self.loaded = asyncio.Event()
        self.block_start = False
        self.generated: list[str] = []
        self.judged: list[str] = []

    weight_version = property(lambda self: 0)  # type: ignore[assignment]

    async def start(self) -> None:
        if self.block_start:
            await self.loaded.wait()

    async def close(self) -> None:
        pass

    async def generate(self, prompts: Sequence[str], params: SamplingParams) -> GenerateOutput:
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail:
            raise RuntimeError("CUDA error: device lost")
        self.generated += prompts
        outputs = []
        for text in prompts:
            texts = [self.answer(text) if self.answer else self.answers[i % len(self.answers)] for i in range(params.n)]
            outputs.append(PromptOutput([1, 2], [Completion(t, [1], [-0.1], "stop") for t in texts]))
        return GenerateOutput(0, outputs)

    def judges(self, verdicts: Sequence[str]) -> bool:
        return True  # judges anything 0.25

    async def judge(self, texts: Sequence[str], correct_token: str, incorrect_token: str) -> JudgeOutput:
        self.judged += texts
        return JudgeOutput(0, [0.25 for _ in texts])

    async def load_weights(self, version: int, path: str, fmt: WeightFormat, sha256: str) -> float:
        raise NotImplementedError
