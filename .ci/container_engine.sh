#!/usr/bin/env bash
# Container engine for the live compose test (`pytest -m compose_live`) on a machine without
# Docker: installs podman (runc runtime, cgroupfs) and podman-compose when they are missing, and
# builds the local images this machine cannot pull, since Docker Hub is unreachable here:
#
#   localhost/debian:bookworm-py   debootstrap'd Debian bookworm with python3 (the BASE_IMAGE)
#   localhost/corl-redis:7         Debian's redis-server on that base (for redis:7.4-alpine)
#   localhost/corl-prometheus:2    Debian's prometheus on that base (for prom/prometheus)
#
# Grafana has no Debian package and its image cannot be pulled: .ci/compose.offline.yml leaves it
# out and the test says so. Idempotent: a second run only checks. Root only (apt, debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_TAG=localhost/debian:bookworm-py
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
  || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
say() { echo "[container_engine $(date +%T)] $*"; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing podman runc debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi

# This sandbox has hybrid cgroups and no CAP_SYS_RESOURCE: crun refuses to start containers and
# raising the default rlimits fails, so runc with cgroupfs and modest ulimits.
conf=/etc/containers/containers.conf
if ! grep -q 'runtime = "runc"' "$conf" 2>/dev/null; then
  say "writing $conf"
  mkdir -p /etc/containers
  cat >"$conf" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
fi

# Beside the test suite (CI_BACKGROUND=1, .ci/prepare.sh) the project's environment is not touched:
# the compose step runs this script again and installs it there.
if [ -z "${CI_BACKGROUND:-}" ] && ! command -v podman-compose >/dev/null; then
  say "installing podman-compose 1.6.0"
  pip install -q "podman-compose==1.6.0"
fi

if ! podman image exists "$BASE_TAG"; then
  say "debootstrap bookworm from $MIRROR -> $BASE_TAG"
  rootfs=$(mktemp -d /tmp/bookworm-py.XXXXXX)
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$MIRROR" \
    >/tmp/debootstrap.log 2>&1 || { tail -20 /tmp/debootstrap.log; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' - "$BASE_TAG" >/dev/null
  rm -rf "$rootfs"
fi

build_side_image() {  # tag, dockerfile text; layer cache makes a rebuild of an unchanged one quick
  say "building $1"
  podman build -q --network host -t "$1" --build-arg BASE_IMAGE="$BASE_TAG" -f - .ci <<<"$2" >/dev/null
}

build_side_image localhost/corl-redis:7 '
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data \
 && printf "%s\\n" "#!/bin/sh" \
      "# The official image entry point by name (docker-compose.yml calls it); the user is already redis here." \
      "exec \"\$@\"" > /usr/local/bin/docker-entrypoint.sh && chmod +x /usr/local/bin/docker-entrypoint.sh
USER redis
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]'

build_side_image localhost/corl-prometheus:2 '
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]'

say "ready: $(podman --version), $(podman-compose --version 2>/dev/null | head -1 || echo 'podman-compose: later')"
