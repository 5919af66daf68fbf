"""Symbolic answer work under a time budget, in worker processes.

math-verify and sympy can spend unbounded time on a short text, holding the GIL as they go:
``\\boxed{2^{2^{20}}}`` took ~17 s, ``\\boxed{10^{10^{7}}}`` over 70 s, freezing whichever service read
it (a model server's ``/v1/grade``, the aggregator's rounds). Every such call runs here instead, in a
small pool of worker processes: a call that passes ``BUDGET_S`` is abandoned, its worker killed and
replaced, and the answer read as no answer. The caller's interpreter never runs the symbolic code.

The pool is per process and started on first use (``warm`` starts it ahead of traffic); it is the
one piece of process-wide state the tasks keep, because a task is a pure plug-in with no lifespan.
"""

from __future__ import annotations

import atexit
import logging
import queue
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

BUDGET_S = 1.5  # per call: a real answer parses in milliseconds (a busy machine's in tens of them)
START_S = 60.0  # a worker's start (imports sympy and math-verify)
WORKERS = 2


class _Worker:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        code = "import sys; from corl.tasks.answer_worker import serve; serve(int(sys.argv[1]))"
        self.proc = subprocess.Popen(  # noqa: S603 (a fixed command line)
            [sys.executable, "-c", code, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        try:
            ready = self.conn.poll(START_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError("the answer worker did not start")

    def call(self, name: str, args: tuple[Any, ...], budget_s: float) -> tuple[bool, Any]:
        """(finished in time, result or None)."""
        self.conn.send((name, args))
        if not self.conn.poll(budget_s):
            return False, None
        status, value = self.conn.recv()
        return True, value if status == "ok" else None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        self.conn.close()


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self.idle.put(None)  # a slot; its worker starts when first needed
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()

    def _start(self) -> _Worker:
        worker = _Worker()
        with self._lock:
            self._workers.add(worker)
        return worker

    def _replace(self) -> None:
        """Start a worker for a freed slot in the background: the next call need not wait for it."""

        def start() -> None:
            try:
                self.idle.put(self._start())
            except (OSError, RuntimeError) as err:
                log.warning("answer worker could not start (%s); the next call tries again", err)
                self.idle.put(None)

        threading.Thread(target=start, name="corl-answer-worker-start", daemon=True).start()

    def call(self, name: str, args: tuple[Any, ...], budget_s: float) -> Any | None:
        worker = self.idle.get()
        try:
            worker = worker or self._start()
            done, value = worker.call(name, args, budget_s)
        except (OSError, EOFError, RuntimeError) as err:
            log.warning("answer worker failed (%s): read as no answer", err)
            done, value = False, None
        if done:
            self.idle.put(worker)
            return value
        if worker is not None:
            log.warning("answer %s took over %.1fs (or failed): read as no answer, worker replaced", name, budget_s)
            self._drop(worker)
        self._replace()
        return None

    def warm(self) -> None:
        slots = [self.idle.get() for _ in range(self.size)]
        try:
            slots = [w or self._start() for w in slots]
        finally:
            for w in slots:
                self.idle.put(w)

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
        worker.kill()

    def close(self) -> None:
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for w in workers:
            w.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Pool(WORKERS)
            atexit.register(_pool.close)
        return _pool


def call(name: str, *args: Any, budget_s: float = BUDGET_S) -> Any | None:
    """``name`` (``read`` or ``verify``, see ``corl.tasks.math``) of ``args`` in a worker, or None when
    it fails or passes ``budget_s``."""
    return _get_pool().call(name, args, budget_s)


def warm() -> None:
    """Start every worker now (a service that reads math answers calls it at start-up, off its event
    loop, so that no answer pays for a worker's start)."""
    _get_pool().warm()
