"""Hostile programs through corl's own sandbox, run *inside* a container (`podman exec -i C python -`):
the attack suite's core (tests/security), for the compose stack's containers and for the image under a
seccomp profile that refuses user namespaces, as Docker's and Kubernetes' defaults do. Prints one JSON
line: {"refused": why} when the sandbox fails closed, else what escaped (nothing, when it holds)."""

import json
import os
import subprocess
import tempfile
import time

from corl.sandbox import Limits, SandboxUnavailable, protections, run_python

LIMITS = Limits(timeout_s=10.0, cpu_s=5, memory_bytes=512 << 20)
DISARM = (
    "import sys\n_l = sys.modules['__main__']\n_l.BLOCKED_EVENTS = ('none',)\n_l.PATH_EVENTS = set()\n"
    "_l.isinstance = lambda *a: True\n"
)
secrets = [v for k, v in os.environ.items() if k.endswith(("TOKEN", "PASSWORD", "KEY")) and len(v) >= 8]
outside = tempfile.mkdtemp(prefix="corl-outside-", dir="/tmp")
os.chmod(outside, 0o777)
victim = subprocess.Popen(["sleep", "60"])
programs = {
    "environ": "import os\nfor p in ('1', str(os.getppid()), 'self'):\n"
    "    try: print(open(f'/proc/{p}/environ').read())\n    except Exception as e: print(repr(e))",
    "write_outside": f"open('{outside}/write', 'w').write('x')",
    "ctypes_system": f"import ctypes\nctypes.CDLL(None).system(b'echo x > {outside}/system')",
    "execv": f"import os\nos.execv('/bin/sh', ['sh', '-c', 'echo x > {outside}/execv'])",
    "loopback": "import socket\nfor port in (8000, 8300):\n"
    "    try:\n        s = socket.create_connection(('127.0.0.1', port), timeout=2)\n"
    "        s.sendall(b'GET /readyz HTTP/1.0\\r\\n\\r\\n')\n        print('REPLY', s.recv(64))\n"
    "    except OSError as e:\n        print(repr(e))",
    "kill": f"import os, signal\nfor p in ({victim.pid}, {os.getpid()}, os.getppid(), 1):\n"
    "    try: os.kill(p, signal.SIGKILL)\n    except Exception as e: print(repr(e))",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
}
try:
    report = {"protections": protections(LIMITS), "escaped": []}
    for name, body in programs.items():
        t0 = time.monotonic()
        res = run_python(DISARM + body, LIMITS)
        out = res.stdout + res.stderr
        if any(s in out for s in secrets) or "REPLY" in res.stdout:
            report["escaped"].append(name)
        report[f"{name}_s"] = round(time.monotonic() - t0, 2)
    time.sleep(0.3)
    report["escaped"] += [f"file:{f}" for f in os.listdir(outside)]
    if victim.poll() is not None:
        report["escaped"].append("victim killed")
except SandboxUnavailable as err:
    report = {"refused": str(err)}
finally:
    victim.kill()
print(json.dumps(report), flush=True)
