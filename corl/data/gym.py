"""Problems from ``reasoning-gym`` generators (``task.source: gym:<generator>``).

The package is fetched like every other (``pip download --no-deps``, pinned) and unpacked once into
the cache; its generators run in a child interpreter (``gym_child.py``) that imports only the
generator's own module, so none of the package's heavy dependencies are needed or installed. A
generator that needs one of them fails with the child's error. Generation is seeded: the same seed,
size and options give the same problems.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from corl import packages

REQUIREMENT = "reasoning-gym==0.1.25"
CHILD = Path(__file__).with_name("gym_child.py")
_NAME = re.compile(r"""(?:DATASET_NAME\s*=\s*|register_dataset\(\s*)["']([a-z0-9_]+)["']""")


def _tree() -> tuple[Path, dict[str, Any]]:
    archive = packages.fetch(REQUIREMENT)
    tree = archive.path.parent / "tree"
    if not (tree / ".complete").exists():
        for member in packages.members(archive):
            if member.startswith("reasoning_gym/") and member.endswith(".py"):
                packages.extract_member(archive, member, tree / member)
        (tree / ".complete").write_text(archive.sha256)
    return tree, archive.record()


def generators(tree: Path) -> dict[str, str]:
    """Generator name -> its module (``arithmetic.gsm_symbolic.gsm_symbolic``), read from the sources."""
    found: dict[str, str] = {}
    for path in sorted((tree / "reasoning_gym").rglob("*.py")):
        m = _NAME.search(path.read_text(errors="replace"))
        if m and path.parent != tree / "reasoning_gym":
            found.setdefault(m.group(1), ".".join(path.relative_to(tree / "reasoning_gym").with_suffix("").parts))
    return found


def generate(
    name: str, *, size: int, seed: int, options: dict[str, Any] | None = None, timeout_s: float = 600.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``size`` problems ``{question, answer}`` of generator ``name`` and the package's provenance."""
    tree, provenance = _tree()
    known = generators(tree)
    if name not in known:
        raise ValueError(f"reasoning-gym has no generator {name!r}; some: {sorted(known)[:40]}")
    config = {**(options or {}), "seed": seed, "size": size}
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-S", str(CHILD), str(tree), known[name], name, json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except subprocess.CalledProcessError as err:
        tail = (err.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"reasoning-gym generator {name!r} failed: {tail[0]}") from None
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return records, {**provenance, "generator": name, "config": config}
