"""A supervisor killed outright (SIGKILL, the OOM killer) takes its children along: the embedded run's
services and its Redis run in sessions of their own, so without ``die_with_parent`` they would keep
running, holding their memory and ports, with nothing left to stop them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")

SUPERVISOR = """
import json, sys, time
from pathlib import Path
from corl.embedded.processes import ProcessGroup
from corl.redis_server import LocalRedis

out = Path(sys.argv[1])
group = ProcessGroup(out / "logs")
child = group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(300)"])
redis = LocalRedis(data_dir=out / "redis").start()
print(json.dumps({"child": child.proc.pid, "redis": redis._proc.pid}), flush=True)
time.sleep(300)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_children_and_redis_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pids: dict[str, int] = {}
    try:
        assert sup.stdout is not None
        pids = json.loads(sup.stdout.readline())
        assert all(_running(pid) for pid in pids.values())
        sup.send_signal(signal.SIGKILL)
        sup.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_running(pid) for pid in pids.values()):
            time.sleep(0.05)
        assert {name: _running(pid) for name, pid in pids.items()} == {"child": False, "redis": False}
    finally:
        sup.kill()
        for pid in pids.values():
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
