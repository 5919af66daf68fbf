"""The answer worker: the process ``corl.tasks.bounded`` starts to run math-verify and sympy under a
time budget. It is its own module so that the pool (imported by the math task) never imports the
task back: only the worker's interpreter loads this, by name, on its command line."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from . import math as task_math


def serve(fd: int) -> None:
    """A worker's loop on the connection ``fd`` (``python -c``: a plain child, not multiprocessing's,
    which would re-import the parent's ``__main__``, a CLI)."""
    conn = Connection(fd)
    calls: dict[str, Callable[..., Any]] = {"read": task_math.read_value, "verify": task_math.verify_value}
    task_math.verify_value("1/2", task_math.read_value("\\frac{1}{2}", True))  # first parses build grammars
    conn.send("ready")
    while True:
        try:
            name, args = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", calls[name](*args)))
        except Exception as err:  # a hostile text may raise anything: it is no answer, not a crash
            conn.send(("error", repr(err)[:200]))
