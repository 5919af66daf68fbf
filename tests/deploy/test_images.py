"""docker/Dockerfile and the offline compose override, read statically (the live build and run are
the `compose_live` tests): users keep today's defaults, CI overrides only sources, never corl."""

from __future__ import annotations

import re

import yaml

from .support import COMPOSE_FILE, ROOT

DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
OVERRIDE = ROOT / ".ci" / "compose.offline.yml"


def _arg_defaults() -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^ARG (\w+)(?:=(.*))?$", DOCKERFILE, re.M) if m[2] is not None}


def test_base_and_package_sources_are_build_args_with_the_user_defaults() -> None:
    args = _arg_defaults()
    assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert args["CA_BUNDLE"] == "" and args["WHEELS_DIR"] == "" and args["PYPI_INDEX_URL"] == ""
    # Every stage starts from the configurable base or from another stage, never a hard-coded image.
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", DOCKERFILE, re.M)
    names = {name for _, name in stages}
    for image, _ in stages:
        assert image in ("${BASE_IMAGE}", "scratch") or image.split("${")[0].rstrip("-") in names or image in names, (
            image
        )
    # pip's own settings are written only when given: an empty `cert` would disable TLS checks.
    assert not re.search(r"^ARG PIP_", DOCKERFILE, re.M)
    assert '[ -z "$CA_BUNDLE" ] || echo "cert = $CA_BUNDLE"' in DOCKERFILE
    assert "/etc/pip.conf" not in DOCKERFILE.split("AS runtime", 1)[1], "pip sources leak into the runtime image"


def test_image_is_multi_stage_and_runs_unprivileged() -> None:
    runtime = DOCKERFILE.split("AS runtime", 1)[1]
    assert "COPY --from=deps /opt/venv /opt/venv" in runtime
    assert "pip install" not in runtime, "the runtime stage gets the built virtualenv only"
    user = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert user and not user[-1].startswith(("0", "root")), user


def test_offline_override_swaps_only_third_party_images() -> None:
    base = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    override = yaml.safe_load(OVERRIDE.read_text())["services"]
    for name, svc in override.items():
        assert not str(base[name].get("image", "")).startswith("${CORL"), f"{name}: a corl service is overridden"
        assert set(svc) <= {"image", "profiles"}, f"{name}: overrides more than where the image comes from"
    assert override["grafana"]["profiles"] != base["grafana"].get("profiles")
