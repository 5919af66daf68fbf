"""The embedded runner's restart policy on real child processes: ``on-failure[:N]`` restarts a child
that exits non-zero or is killed with SIGKILL, after an exponential back-off, at most N times; ``no``
(and a clean exit) stop the run with the child named."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from corl.embedded.processes import ChildDied, ProcessGroup, RestartPolicy


def supervise(group: ProcessGroup, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        group.check()
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("no", RestartPolicy()),
        ("on-failure", RestartPolicy(on_failure=True, max_restarts=5)),
        ("on-failure:3", RestartPolicy(on_failure=True, max_restarts=3)),
    ],
)
def test_parse(text: str, policy: RestartPolicy) -> None:
    assert RestartPolicy.parse(text) == policy


@pytest.mark.parametrize("text", ["always", "on-failure:x", "no:2", ""])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="on-failure"):
        RestartPolicy.parse(text)


def test_backoff_doubles_up_to_the_cap() -> None:
    p = RestartPolicy(on_failure=True, backoff_s=1.0, backoff_max_s=5.0)
    assert [p.delay_s(k) for k in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_crashing_child_is_restarted_n_times_then_named(tmp_path: Path) -> None:
    policy = RestartPolicy(on_failure=True, max_restarts=2, backoff_s=0.05)
    group = ProcessGroup(tmp_path, restart=policy)
    group.start("crasher", [sys.executable, "-c", "print('run', flush=True); raise SystemExit(3)"])
    t0 = time.monotonic()
    with pytest.raises(ChildDied) as died:
        supervise(group, 30)
    assert died.value.name == "crasher" and died.value.returncode == 3
    assert (tmp_path / "crasher.log").read_text().count("run") == 3  # the first start and 2 restarts
    assert time.monotonic() - t0 >= 0.05 + 0.1  # backed off before each restart
    assert group.restarts == {"crasher": 2}


def test_a_sigkilled_child_comes_back(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path, restart=RestartPolicy(on_failure=True, max_restarts=1, backoff_s=0.05))
    child = group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = child.proc.pid  # type: ignore[union-attr]
        child.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        child.proc.wait()  # type: ignore[union-attr]
        supervise(group, 1.0)
        assert child.proc.pid != first and child.proc.poll() is None  # type: ignore[union-attr]
        assert group.restarts == {"sleeper": 1}
    finally:
        group.stop()


@pytest.mark.parametrize(
    ("policy", "code"), [(RestartPolicy(), 1), (RestartPolicy(on_failure=True), 0)], ids=["no", "clean-exit"]
)
def test_no_restart(tmp_path: Path, policy: RestartPolicy, code: int) -> None:
    group = ProcessGroup(tmp_path, restart=policy)
    group.start("once", [sys.executable, "-c", f"raise SystemExit({code})"])
    with pytest.raises(ChildDied, match="once exited with code"):
        supervise(group, 30)
    assert group.restarts == {}


def test_a_childs_own_environment_adds_to_the_groups_and_survives_a_restart(tmp_path: Path) -> None:
    """``corl run`` gives model servers their request time limit this way (CORL_REQUEST_TIMEOUT_S)."""
    policy = RestartPolicy.parse("on-failure:1")
    group = ProcessGroup(tmp_path / "logs", env={"A": "group", "B": "group"}, restart=policy)
    script = "import os, sys; print(os.environ['A'], os.environ['B'], flush=True); sys.exit(3)"
    child = group.start("c", [sys.executable, "-c", script], env={"B": "child"})
    with pytest.raises(ChildDied):
        supervise(group, 10.0)  # exits 3, is restarted once, exits 3 again
    assert child.log_path.read_text().split() == ["group", "child", "group", "child"]
    group.stop()
