"""Hostile programs through the project's own code-execution path (``corl.sandbox.run_python``, and the
code task's held-out check), each effect checked from outside: a canary secret in this process's
environment, a file outside the program's directory, a loopback listener, a victim process of the
sandbox's own uid, this process alive. Every program first disarms the launcher's audit hook (it
shares the program's interpreter: the hook is no boundary), so what holds is the jail."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corl.sandbox import Limits, SandboxUnavailable, protections, run_python
from corl.sandbox.jail import ALLOW_INSECURE_ENV, probe
from corl.tasks import Example, get_task

pytestmark = pytest.mark.security

LIMITS = Limits(timeout_s=5.0, cpu_s=3, memory_bytes=512 << 20)
CANARY_SECRET = "corl-canary-" + os.urandom(8).hex()
DISARM = """
import sys
_launcher = sys.modules['__main__']
_launcher.BLOCKED_EVENTS = ('no-such-event',)
_launcher.PATH_EVENTS = set()
_launcher.isinstance = lambda *a: True
"""


@pytest.fixture(autouse=True)
def _secret_in_our_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORL_ADMIN_TOKEN", CANARY_SECRET)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory anyone may write to, outside the program's: only the jail keeps the program out."""
    d = Path(tempfile.mkdtemp(prefix="corl-outside-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def hostile(body: str) -> str:
    return DISARM + body


@pytest.mark.jail
def test_the_jail_is_in_force_here() -> None:
    jail, missing = probe(LIMITS.uid)
    assert jail is not None, missing
    info = protections(LIMITS)
    assert info["isolation"].startswith("bwrap") and info["uid"] != 0


@pytest.mark.jail
def test_tampering_with_the_launcher_then_writing_outside(outside: Path) -> None:
    target = outside / "escaped"
    res = run_python(hostile(f"open({str(target)!r}, 'w').write('x')\nprint('wrote')"), LIMITS)
    assert not target.exists()
    assert "wrote" not in res.stdout  # the directory is not even there inside the jail


@pytest.mark.jail
@pytest.mark.parametrize("which", ["parent", "pid1", "every"])
def test_no_other_process_environment_is_readable(which: str) -> None:
    body = {
        "parent": f"import os\nfor p in (os.getppid(), {os.getpid()}):\n"
        "    try: print(open(f'/proc/{p}/environ').read())\n    except Exception as e: print(repr(e))",
        "pid1": "print(open('/proc/1/environ').read())",
        "every": "import os\nfor p in os.listdir('/proc'):\n"
        "    try: print(open(f'/proc/{p}/environ').read())\n    except Exception: pass",
    }[which]
    res = run_python(hostile(body), LIMITS)
    assert CANARY_SECRET not in res.stdout + res.stderr


@pytest.mark.jail
def test_no_socket_reaches_a_loopback_listener(loopback_listener: socket.socket) -> None:
    server = loopback_listener
    port = server.getsockname()[1]
    accepted: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(64))
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    body = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    body += "s.sendall(b'escaped')\nprint('sent')"
    res = run_python(hostile(body), LIMITS)
    time.sleep(0.3)
    stop.set()
    t.join(2)
    assert accepted == [] and "sent" not in res.stdout


@pytest.mark.jail
def test_ctypes_system_and_execv_leave_nothing_outside(outside: Path) -> None:
    for i, body in enumerate(
        [
            "import ctypes\nctypes.CDLL(None).system(b'echo x > {t}; echo ran')",
            "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo x > {t}; echo ran'])",
        ]
    ):
        target = outside / f"escaped-{i}"
        res = run_python(hostile(body.format(t=target)), LIMITS)
        assert not target.exists(), res.stdout + res.stderr


@pytest.mark.jail
def test_no_process_outside_the_jail_can_be_signalled() -> None:
    victim = subprocess.Popen(["sleep", "60"], user=LIMITS.uid, group=LIMITS.uid, extra_groups=[])
    try:
        body = f"import os, signal\nfor p in ({victim.pid}, {os.getpid()}, os.getppid()):\n"
        body += "    try: os.kill(p, signal.SIGKILL)\n    except Exception as e: print(repr(e))"
        run_python(hostile(body), LIMITS)
        time.sleep(0.2)
        assert victim.poll() is None  # the victim (same uid as the sandbox) lives, and so do we
    finally:
        victim.kill()
        victim.wait()


def _processes_of(uid: int) -> int:
    out = subprocess.run(["ps", "-o", "pid=", "-u", str(uid)], capture_output=True, text=True, check=False)
    return len(out.stdout.split())


@pytest.mark.jail
def test_a_fork_bomb_ends_with_the_jail() -> None:
    before = _processes_of(LIMITS.uid)
    t0 = time.monotonic()
    res = run_python(hostile("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"), LIMITS)
    assert res.status in ("timeout", "killed", "error")
    assert time.monotonic() - t0 < LIMITS.timeout_s + 5
    time.sleep(0.5)
    assert _processes_of(LIMITS.uid) <= before


@pytest.mark.parametrize("exit_call", ["import os; os._exit(0)", "import sys; sys.exit(0)"])
def test_an_early_exit_does_not_pass_the_held_out_tests(exit_call: str) -> None:
    task = get_task("code")
    prompt = 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    ex = Example(prompt, None, {"test": test, "entry_point": "add"})
    assert task.is_correct(ex, "    return a + b\n")
    assert not task.is_correct(ex, f"    {exit_call}\n")  # the call runs inside check()
    assert not task.is_correct(ex, f"    return a - b\n\n{exit_call}\n")  # before check() is ever reached


def test_without_the_jail_code_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from corl.sandbox import jail

    jail.probe.cache_clear()
    monkeypatch.setattr(jail.shutil, "which", lambda name: None)
    monkeypatch.delenv(ALLOW_INSECURE_ENV, raising=False)
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            run_python("print(1)", LIMITS)
        monkeypatch.setenv(ALLOW_INSECURE_ENV, "1")
        res = run_python("import json; print(json.load(open('protections.json'))['isolation'])", LIMITS)
        assert res.ok and "insecure" in res.stdout
    finally:
        jail.probe.cache_clear()


def test_a_code_run_is_refused_before_it_starts_without_the_jail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight (corl run, corl experiment) names what is missing; the config may accept the risk."""
    from corl.config import parse_config
    from corl.preflight import PreflightError, sandbox_ready
    from corl.sandbox import jail

    members = [{"name": n, "model": n, "servers": [f"http://127.0.0.1:{p}"]} for n, p in (("a", 8001), ("b", 8002))]
    cfg = parse_config({"members": members, "task": {"name": "code", "source": "packaged:humaneval"}})
    jail.probe.cache_clear()
    monkeypatch.setattr(jail.shutil, "which", lambda name: None)
    monkeypatch.delenv(ALLOW_INSECURE_ENV, raising=False)
    try:
        with pytest.raises(PreflightError, match="bubblewrap"):
            sandbox_ready(cfg)
        sandbox_ready(cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"allow_insecure": True})}))
        sandbox_ready(parse_config({"members": members}))  # a task that runs no code needs no jail
    finally:
        jail.probe.cache_clear()
