"""The sandbox service (``corl serve sandbox``): the one place code runs where a service's host refuses the
jail. It runs programs in its own jail for holders of its token; a service pointed at it
(``CORL_SANDBOX_URL``) sends every program there and needs no jail of its own; unreachable, or without
a jail of its own, it fails closed."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from live_aggregator import serve

from corl.redis_server import free_port
from corl.sandbox import SandboxUnavailable, require_sandbox, run_python
from corl.sandbox import jail as jail_module
from corl.sandbox.remote import SANDBOX_TOKEN_ENV, SANDBOX_URL_ENV
from corl.services.sandbox import SandboxSettings, create_app

pytestmark = pytest.mark.security

TOKEN = "sandbox-" + os.urandom(12).hex()
CANARY = "corl-canary-" + os.urandom(8).hex()
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = """
import os, sys
_l = sys.modules['__main__']; _l.BLOCKED_EVENTS = ('none',); _l.PATH_EVENTS = set(); _l.isinstance = lambda *a: True
print(dict(os.environ))
for p in os.listdir('/proc'):
    try: print(open(f'/proc/{p}/environ').read())
    except Exception: pass
"""


@pytest.fixture
def sandbox_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv(SANDBOX_URL_ENV, raising=False)
    monkeypatch.setenv("CORL_ADMIN_TOKEN", CANARY)  # a secret of the process the service runs in
    with serve(create_app(SandboxSettings(token=TOKEN, max_concurrent=2))) as url:
        yield url


@pytest.mark.jail
def test_the_service_runs_programs_in_its_jail_for_holders_of_its_token(sandbox_url: str) -> None:
    run = f"{sandbox_url}/v1/run"
    assert httpx.post(run, json={"source": "print(6 * 7)"}, timeout=30).status_code == 401
    ok = httpx.post(run, json={"source": "print(6 * 7)"}, headers=AUTH, timeout=30).json()
    assert ok["status"] == "ok" and ok["returncode"] == 0 and ok["stdout"].strip() == "42"
    failed = httpx.post(run, json={"source": "import sys; sys.exit(3)"}, headers=AUTH, timeout=30).json()
    assert failed["status"] == "error" and failed["returncode"] == 3
    slow = {"source": "while True: pass", "limits": {"timeout_s": 1, "cpu_s": 5}}
    assert httpx.post(run, json=slow, headers=AUTH, timeout=30).json()["status"] == "timeout"
    too_long = {"source": "print(1)", "limits": {"timeout_s": 1000}}
    assert httpx.post(run, json=too_long, headers=AUTH, timeout=30).status_code == 422
    hostile = httpx.post(run, json={"source": HOSTILE}, headers=AUTH, timeout=30).json()
    assert CANARY not in hostile["stdout"] + hostile["stderr"] and TOKEN not in hostile["stdout"]
    metrics = httpx.get(f"{sandbox_url}/metrics", timeout=10).text
    assert 'corl_sandbox_programs_total{status="ok"}' in metrics and "corl_sandbox_program_seconds" in metrics


@pytest.mark.jail
def test_a_service_pointed_at_it_sends_every_program_there_and_needs_no_jail_of_its_own(
    sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SANDBOX_URL_ENV, sandbox_url)
    monkeypatch.setenv(SANDBOX_TOKEN_ENV, TOKEN)
    monkeypatch.delenv(jail_module.ALLOW_INSECURE_ENV, raising=False)
    with monkeypatch.context() as m:  # (the service runs in this process: its own jail is put back after)
        m.setattr(jail_module, "probe", lambda uid: (None, "this host refuses user namespaces"))
        require_sandbox()  # the service named: no jail needed here
    res = run_python("print(sum(range(10)))")
    assert res.ok and res.stdout.strip() == "45"
    page = httpx.get(f"{sandbox_url}/metrics", timeout=10).text
    assert 'corl_sandbox_programs_total{status="ok"} 1.0' in page  # it ran there, once
    monkeypatch.setenv(SANDBOX_TOKEN_ENV, "wrong-token-0123456789")
    with pytest.raises(SandboxUnavailable, match="refused the program: 401"):
        run_python("print(1)")


def test_an_unreachable_service_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SANDBOX_URL_ENV, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SandboxUnavailable, match="cannot be reached"):
        run_python("print(1)")


async def test_the_service_refuses_to_start_without_a_jail_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SANDBOX_URL_ENV, raising=False)
    monkeypatch.delenv(jail_module.ALLOW_INSECURE_ENV, raising=False)
    monkeypatch.setattr(jail_module, "probe", lambda uid: (None, "bubblewrap (bwrap) is not installed"))
    app = create_app(SandboxSettings(token=TOKEN))
    with pytest.raises(SandboxUnavailable, match="bwrap"):
        async with app.router.lifespan_context(app):
            pass
