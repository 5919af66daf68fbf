"""Start, watch and stop the child processes of an embedded run.

Every child writes to its own log file in the run directory. If one dies, ``check`` either restarts
it (``RestartPolicy`` ``on-failure[:N]``, like compose's ``restart:``: a non-zero exit is restarted
after an exponential back-off, at most N times) or names it with the tail of its log so the caller
can shut the rest down instead of hanging (``no``, the default).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corl.health import NotReadyError, wait_healthy

log = logging.getLogger(__name__)


class ChildDied(RuntimeError):
    def __init__(self, name: str, returncode: int, log_tail: str):
        super().__init__(f"{name} exited with code {returncode}")
        self.name, self.returncode, self.log_tail = name, returncode, log_tail


@dataclass(frozen=True)
class RestartPolicy:
    """``no`` or ``on-failure[:N]``: restart a child that exits non-zero (a kill -9 included) up to
    ``max_restarts`` times, waiting ``backoff_s * 2**k`` (capped at ``backoff_max_s``) before the k-th."""

    on_failure: bool = False
    max_restarts: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    @classmethod
    def parse(cls, text: str) -> RestartPolicy:
        mode, _, cap = text.partition(":")
        if mode == "no" and not cap:
            return cls()
        if mode == "on-failure" and (not cap or cap.isdigit()):
            return cls(on_failure=True, max_restarts=int(cap) if cap else cls.max_restarts)
        raise ValueError(f"restart policy {text!r}: expected 'no' or 'on-failure[:N]'")

    def delay_s(self, restarts: int) -> float:
        return float(min(self.backoff_max_s, self.backoff_s * 2**restarts))


@dataclass
class Child:
    name: str
    args: list[str]
    log_path: Path
    health_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of the group's
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    restart_at: float | None = None  # monotonic time of a scheduled restart

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class ProcessGroup:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    restart: RestartPolicy = field(default_factory=RestartPolicy)

    def start(
        self, name: str, args: Sequence[str], health_url: str | None = None, env: dict[str, str] | None = None
    ) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name, list(args), self.log_dir / f"{name}.log", health_url, dict(env or {}))
        self._spawn(child)
        self.children.append(child)
        return child

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **self.env, **child.env}
        with child.log_path.open("ab") as out:
            # A new session per child, so a Ctrl-C in the terminal reaches only the supervisor,
            # which then stops the children in order.
            child.proc = subprocess.Popen(
                child.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        log.info("started %s (pid %d): %s", child.name, child.proc.pid, " ".join(child.args))

    def check(self) -> None:
        """Restart children that died under the restart policy; raise ChildDied for any other exit."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or (code := c.proc.poll()) is None:
                continue
            if not self.restart.on_failure or code == 0 or c.restarts >= self.restart.max_restarts:
                raise ChildDied(c.name, code, c.tail())
            if c.restart_at is None:
                c.restart_at = now + self.restart.delay_s(c.restarts)
                log.warning(
                    "%s exited with code %d: restart %d of %d in %.1fs",
                    c.name,
                    code,
                    c.restarts + 1,
                    self.restart.max_restarts,
                    c.restart_at - now,
                )
            elif now >= c.restart_at:
                c.restarts += 1
                c.restart_at = None
                self._spawn(c)

    @property
    def restarts(self) -> dict[str, int]:
        return {c.name: c.restarts for c in self.children if c.restarts}

    def wait_healthy(self, timeout_s: float = 180.0) -> None:
        """Wait until every child with a health URL answers 200 on it, failing fast if one dies."""
        for c in self.children:
            if c.health_url:
                try:
                    wait_healthy(c.health_url, timeout_s, alive=self.check)
                except NotReadyError:
                    raise TimeoutError(f"{c.name} not ready after {timeout_s:.0f}s:\n{c.tail()}") from None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every child (reverse start order), then SIGKILL what is left."""
        for c in reversed(self.children):
            if c.proc and c.proc.poll() is None:
                _signal(c.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for c in reversed(self.children):
            if c.proc is None:
                continue
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop after SIGTERM; killing it", c.name)
                _signal(c.proc, signal.SIGKILL)
                c.proc.wait()

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.proc]


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Stop one child that is still running: SIGTERM, then SIGKILL once ``timeout_s`` has passed; reaped
    either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child that must not outlive this process: on Linux the kernel sends it
    SIGTERM when this process dies, a SIGKILL or the OOM killer included, where its own session would
    otherwise leave it running (a model server holding gigabytes, a Redis holding the port). The
    kernel ties the signal to the *thread* that starts the child: start such children from a thread
    that lives as long as they should (the supervisors here start them from their main thread).
    None elsewhere: a supervisor's own ``finally`` is then the only stop."""
    if _libc is None:
        return None
    parent, prctl = os.getpid(), _libc.prctl

    def preexec() -> None:  # runs in the child between fork and exec: nothing that takes a lock
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, and SIGINT into KeyboardInterrupt even where it was inherited as
    ignored, so a supervisor's ``finally`` stops its children.

    Children run in their own sessions (so a terminal Ctrl-C reaches only the supervisor), which
    also means nothing else would stop them if the supervisor were terminated.
    """

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    # A shell without job control starts background commands with SIGINT ignored, and Python keeps
    # an inherited SIG_IGN: Ctrl-C (or `kill -INT`) must still stop a supervisor started that way.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def corl_command(*args: str) -> list[str]:
    """The ``corl`` CLI of this interpreter, independent of PATH."""
    return [sys.executable, "-m", "corl", *args]


def trainer_group_command(processes: int, *args: str) -> list[str]:
    """``corl ARGS`` as a trainer group of ``processes`` ranks on this machine, under torchrun: one
    rank that exits abnormally stops the others and the group exits non-zero (``--max-restarts 0``:
    the run's restart policy starts the group again, from its newest checkpoint)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    return [*launcher, "--nproc-per-node", str(processes), "--max-restarts", "0", "-m", "corl", *args]
