"""Build a cohort on disk: create each member from its config class, warm it up, save it.

Layout of ``out``::

    cohort.json                  manifest (corl.cohort.manifest.CohortManifest)
    <member>/config.json         save_pretrained layout: AutoModelForCausalLM / vLLM load it by path
    <member>/model.safetensors
    <member>/tokenizer.json ...  the char tokenizer, AutoTokenizer loads it by path
    <member>/corl_member.json    name, family, task, params, seed
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .loading import MEMBER_META, parameter_count
from .manifest import CohortManifest, MemberRecord, write_manifest
from .presets import MemberSpec, Preset, WarmupSettings, get_preset
from .warmup import WarmupResult, warm_up

# Progress callbacks: (member, event, step, value) with event "start" | "step" | "check" | "done".
ProgressFn = Callable[[str, str, int, float], None]


def build_member(
    spec: MemberSpec,
    out_dir: str | Path,
    *,
    task_name: str = "addition",
    seed: int = 0,
    init_seed: int | None = None,
    warmup: WarmupSettings | None = None,
    progress: ProgressFn | None = None,
) -> MemberRecord:
    """Create, warm up and save one member into ``out_dir`` (its own directory).

    ``seed`` picks the task splits (shared by the whole cohort); ``init_seed`` (default: ``seed``)
    the initial weights and the warm-up batch order.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from corl.models.tokenizer import build_char_tokenizer
    from corl.tasks import get_task

    out_dir = Path(out_dir)
    task = get_task(task_name)
    splits = task.splits(seed)
    tokenizer = build_char_tokenizer()
    init_seed = seed if init_seed is None else init_seed
    torch.manual_seed(init_seed)
    model = AutoModelForCausalLM.from_config(spec.build_config(tokenizer))
    params = parameter_count(model)
    report = progress or (lambda *_: None)
    report(spec.name, "start", 0, float(params))
    result: WarmupResult = warm_up(
        model,
        tokenizer,
        task,
        splits.warmup,
        splits.eval,
        warmup or WarmupSettings(),
        seed=init_seed,
        on_step=lambda s, loss: report(spec.name, "step", s, loss),
        on_check=lambda s, acc: report(spec.name, "check", s, acc),
    )
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    meta = {
        "name": spec.name,
        "family": spec.family,
        "task": task_name,
        "params": params,
        "seed": seed,
        "init_seed": init_seed,
    }
    (out_dir / MEMBER_META).write_text(json.dumps(meta, indent=2) + "\n")
    report(spec.name, "done", result.steps, result.accuracy)
    return MemberRecord(
        name=spec.name,
        family=spec.family,
        path=out_dir.name,
        params=params,
        warmup_steps=result.steps,
        warmup_seconds=round(result.seconds, 2),
        accuracy=result.accuracy,
        in_band=result.in_band,
        rollbacks=result.rollbacks,
    )


def build_cohort(
    out: str | Path,
    preset: str | Preset = "tiny",
    *,
    seed: int = 0,
    task_name: str = "addition",
    warmup_overrides: dict[str, Any] | None = None,
    members: list[str] | None = None,
    progress: ProgressFn | None = None,
    jobs: int = 1,
    threads: int = 1,
) -> CohortManifest:
    """Build every member of ``preset`` (or only ``members``) under ``out`` and write ``cohort.json``.

    ``warmup_overrides`` replaces fields of the preset's ``WarmupSettings`` (e.g. ``band``,
    ``max_steps``, ``check_every``). ``jobs > 1`` builds that many members at once in separate
    processes of ``threads`` torch threads each: these models are too small for intra-op threads
    to pay off, so on 2 cores two single-threaded members beat one two-threaded member.
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    settings = replace(p.warmup, **(warmup_overrides or {}))
    specs = [s for s in p.members if members is None or s.name in members]
    if members is not None and len(specs) != len(set(members)):
        unknown = sorted(set(members) - {s.name for s in p.members})
        raise ValueError(f"unknown members {unknown} for preset {p.name!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Member i starts from init seed seed + i so that members of the same size still start from
    # different weights; the task splits are the cohort's (``seed``).
    jobs_kw: list[dict[str, Any]] = [
        dict(spec=spec, out_dir=out / spec.name, task_name=task_name, seed=seed, init_seed=seed + i, warmup=settings)
        for i, spec in enumerate(specs)
    ]
    if jobs <= 1 or len(specs) <= 1:
        records = [build_member(**kw, progress=progress) for kw in jobs_kw]
    else:
        records = _build_parallel(jobs_kw, jobs, threads, progress)
    manifest = CohortManifest(
        preset=p.name,
        task=task_name,
        seed=seed,
        band=settings.band,
        members=records,
        total_seconds=round(time.perf_counter() - t0, 2),
    )
    write_manifest(manifest, out)
    return manifest


def _build_in_worker(kw: dict[str, Any], events: Any, threads: int) -> MemberRecord:
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return build_member(**kw, progress=lambda *e: events.put(e))


def _build_parallel(
    jobs_kw: list[dict[str, Any]], jobs: int, threads: int, progress: ProgressFn | None
) -> list[MemberRecord]:
    """Build members in ``jobs`` spawned processes, relaying their progress events to ``progress``."""
    import multiprocessing as mp
    import queue
    from concurrent.futures import ProcessPoolExecutor, wait

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        events = manager.Queue()
        futures = [pool.submit(_build_in_worker, kw, events, threads) for kw in jobs_kw]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2)
            while True:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    break
                if progress:
                    progress(*event)
        return [f.result() for f in futures]
