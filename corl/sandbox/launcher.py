"""The sandbox's first stage, run as ``python -I -S launcher.py <workdir> <json limits>``.

Inside the jail (``jail.py``; ``"jailed": true``) the namespaces and the uid are already in force and
this stage only sets rlimits and the audit hook, defence in depth: the hook shares the program's
interpreter and is no boundary on its own. Outside it (the operator allowed insecure runs), it
does what it can alone, as described next.

Standard library only: it runs before any corl code could be imported. In order it: cuts the
process off the network (a fresh network namespace: as root directly, otherwise inside a new user
namespace; skipped where the kernel refuses), pre-imports the modules untrusted programs commonly
need (the interpreter's files may be unreadable once privileges drop), drops to an unprivileged uid
when it runs as root, sets rlimits (CPU time, address space, file size, processes, open files, no
core files), installs an audit hook that refuses writes outside the working directory, sockets,
subprocesses, forks and ctypes, and then runs ``main.py`` from the working directory. What was in
force is written to ``protections.json`` before the untrusted code starts.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PRELOAD = (
    "array bisect collections copy dataclasses datetime decimal enum fractions functools hashlib heapq "
    "itertools json math operator random re statistics string textwrap typing unicodedata"
).split()
BLOCKED_EVENTS = (
    "socket.",
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "ctypes.",
    "pty.spawn",
    "webbrowser.open",
)
PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink"}


def _unshare_network() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = [CLONE_NEWNET] if os.geteuid() == 0 else [CLONE_NEWUSER | CLONE_NEWNET]
    for f in flags:
        if libc.unshare(f) == 0:
            return "namespace"
    return "none (kernel refused a network namespace; sockets are refused by the audit hook only)"


def _drop_privileges(uid: int) -> int:
    if os.geteuid() != 0:
        return os.geteuid()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return os.geteuid()


def _rlimits(limits: dict[str, int]) -> None:
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["file_bytes"]),
        ("RLIMIT_NPROC", limits["processes"]),
        ("RLIMIT_NOFILE", 64),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _audit(workdir: str):  # type: ignore[no-untyped-def]
    root = os.path.realpath(workdir)

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        try:
            p = os.fsdecode(path)  # type: ignore[arg-type]
        except TypeError:
            return False
        full = os.path.realpath(os.path.join(root, p))
        return full == root or full.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:  # type: ignore[type-arg]
        if event.startswith(BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
        elif event in PATH_EVENTS and args and not inside(args[0]):
            raise PermissionError(f"sandbox: {event} outside the working directory")

    return hook


def main() -> None:
    workdir, limits = sys.argv[1], json.loads(sys.argv[2])
    os.chdir(workdir)
    jailed = bool(limits.get("jailed"))
    network = "namespace (bwrap)" if jailed else _unshare_network()
    for name in PRELOAD:
        __import__(name)
    uid = os.geteuid() if jailed else _drop_privileges(limits["uid"])
    _rlimits(limits)
    isolation = "bwrap: user, mount, pid, network, ipc, uts, cgroup namespaces" if jailed else "none (insecure)"
    with open("protections.json", "w") as f:
        json.dump({"isolation": isolation, "network": network, "uid": uid, "rlimits": True, "audit_hook": True}, f)
    code = compile(open("main.py").read(), "main.py", "exec")
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    sys.addaudithook(_audit(workdir))
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
