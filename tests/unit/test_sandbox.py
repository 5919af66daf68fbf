"""Untrusted programs run in the sandbox: a hostile or broken program gets a clear result for itself
and changes nothing outside its working directory."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from corl.sandbox import Limits, protections, run_python
from corl.sandbox.runner import LAUNCHER

FAST = Limits(timeout_s=3.0, cpu_s=2, memory_bytes=512 << 20)


def test_a_plain_program_runs_and_its_output_comes_back() -> None:
    res = run_python("import math, hashlib\nprint(math.factorial(5), hashlib.md5(b'a').hexdigest()[:6])", FAST)
    assert res.ok and res.stdout.split() == ["120", "0cc175"]


def test_infinite_loop_times_out_within_the_wall_clock() -> None:
    t0 = time.monotonic()
    res = run_python("while True:\n    pass\n", FAST)
    assert res.status in ("timeout", "killed") and not res.ok
    assert time.monotonic() - t0 < FAST.timeout_s + 3


def test_fork_bomb_is_stopped_and_leaves_no_processes() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = run_python(bomb, FAST)
    assert not res.ok
    # Nothing of it survives: no sandboxed interpreter is left running.
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(LAUNCHER) in _cmdline(p)]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_memory_hog_fails_cleanly() -> None:
    # Time enough to reach the memory limit on a loaded machine (under memory pressure, zero-filling
    # 512 MB once took longer than FAST's 3 s): the limit, not the clock, must stop it.
    hog = "x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n"
    res = run_python(hog, replace(FAST, timeout_s=30.0, cpu_s=10))
    assert not res.ok and res.status in ("error", "killed")
    assert res.status == "killed" or "MemoryError" in res.stderr


def test_socket_never_reaches_a_listener(loopback_listener: socket.socket) -> None:
    port = loopback_listener.getsockname()[1]
    res = run_python(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n", FAST)
    assert not res.ok
    with pytest.raises(TimeoutError):
        loopback_listener.accept()


def test_writing_outside_the_working_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    os.chmod(tmp_path, 0o777)  # even a world-writable folder is out of reach
    res = run_python(f"open({str(target)!r}, 'w').write('pwned')\n", FAST)
    assert not res.ok and not target.exists()
    inside = run_python("open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())\n", FAST)
    assert inside.ok and inside.stdout.strip() == "fine"


def test_huge_output_is_capped() -> None:
    res = run_python("print('x' * (50 << 20))\n", Limits(timeout_s=5.0, file_bytes=1 << 16))
    assert not res.ok and len(res.stdout) <= 1 << 16


@pytest.mark.jail
def test_protections_are_reported() -> None:
    info = protections(FAST)
    assert info["rlimits"] is True and info["audit_hook"] is True
    assert info["isolation"].startswith("bwrap") and info["network"] == "namespace (bwrap)"
    if os.geteuid() == 0:  # bwrap is started as the sandbox uid: inside, the program is nobody
        assert info["uid"] == FAST.uid
