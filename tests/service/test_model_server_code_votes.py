"""The model server's vote path with the code task: its own samples' programs and the graded responses
run in the sandbox (off the event loop); hostile programs get a score of 0 and the server keeps
answering."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from corl.services.model.app import create_app
from corl.services.model.settings import ServerSettings
from corl.services.model.testing import FakeBackend


@asynccontextmanager
async def serve(backend: FakeBackend, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServerSettings(_env_file=None, model_dir="unused", **overrides)  # type: ignore[call-arg, arg-type]
    app = create_app(settings, backend)
    async with app.router.lifespan_context(app):
        await app.state.serving.wait_ready(5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as c:
            yield c


PROMPT = 'def add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    >>> add(-1, 1)\n    0\n    """\n'
RIGHT = "    return a + b\n"
ALSO_RIGHT = "```python\ndef add(a, b):\n    return sum([a, b])\n```"
WRONG = "    return a - b\n"
HOSTILE = {
    "infinite loop": "    while True:\n        pass\n",
    "fork bomb": "    import os\n    while True:\n        os.fork()\n",
    "memory hog": "    x = []\n    while True:\n        x.append(bytearray(50 << 20))\n",
    "socket": "    import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n    return a + b\n",
    "escape": "    open('/tmp/corl-escaped', 'w').write('x')\n    return a + b\n",
}


async def test_code_votes_compare_behaviour_and_survive_hostile_programs() -> None:
    # The server's own 4 samples: two right programs (different text), one wrong, one infinite loop.
    own = [RIGHT, ALSO_RIGHT, WRONG, HOSTILE["infinite loop"]]
    items = [{"prompt": PROMPT, "response": r} for r in [ALSO_RIGHT, WRONG, *HOSTILE.values()]]
    async with serve(FakeBackend(own), request_timeout_s=120, tasks="code") as c:  # CORL_TASKS=code
        grade = asyncio.create_task(
            c.post("/v1/grade", json={"task": "code", "items": items, "n_votes": 4, "sampling": {"max_tokens": 64}})
        )
        # Programs run in worker threads: the server answers health checks meanwhile.
        t0 = time.monotonic()
        while not grade.done():
            r = await c.get("/healthz")
            assert r.status_code == 200 and time.monotonic() - t0 < 120
            await asyncio.sleep(0.2)
        r = grade.result()
        assert r.status_code == 200, r.text
        right, wrong, *hostile = r.json()["scores"]
        assert (right, wrong) == (0.5, 0.25)
        assert hostile == [0.0] * len(HOSTILE)
        assert (await c.get("/readyz")).status_code == 200
        again = await c.post("/v1/grade", json={"task": "code", "items": items[:1], "n_votes": 4})
        assert again.json()["scores"] == [0.5]
