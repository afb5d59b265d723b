#!/bin/bash
# make docker-test: lints docker/Dockerfile, checks the Kubernetes and KServe
# manifests, builds the image with podman and runs it (docker_test.py).
#
# Works on a fresh Debian machine: as root it installs podman, runc and
# debootstrap when missing, and when no debian:bookworm-slim image is stored
# it makes one with debootstrap (no registry is needed).
#
# Environment: PYTHON (the test venv's python), ATTND_BIN (build/attnd),
# ATTND_IMAGE (image tag to build, default localhost/attnd:test).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
IMAGE=${ATTND_IMAGE:-localhost/attnd:test}
BASE=debian:bookworm-slim
# crun cannot set up cgroups on some hosts; runc works everywhere we run.
PODMAN=(podman --runtime runc)

step() { echo "== $*"; }

need_pkgs=""
for p in podman runc debootstrap nodejs npm; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs="$need_pkgs $p"
done
if [ -n "$need_pkgs" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing packages; run: sudo apt-get install -y$need_pkgs" >&2
        exit 1
    fi
    step "installing$need_pkgs"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $need_pkgs
fi

step "dockerfilelint (pinned in tests/deploy/package.json)"
if [ ! -x tests/deploy/node_modules/.bin/dockerfilelint ]; then
    (cd tests/deploy && npm ci --no-audit --no-fund --loglevel=error)
fi
tests/deploy/node_modules/.bin/dockerfilelint docker/Dockerfile

step "manifests"
"$PYTHON" tests/deploy/validate_manifests.py

if ! "${PODMAN[@]}" image exists "$BASE"; then
    step "making $BASE with debootstrap"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    debootstrap --variant=minbase bookworm "$tmp/root" >"$tmp/debootstrap.log" 2>&1 ||
        { tail -20 "$tmp/debootstrap.log"; exit 1; }
    # Like the published image: the three suites in deb822 form, and no
    # downloaded package lists or archives left behind.
    rm -f "$tmp/root/etc/apt/sources.list"
    cat >"$tmp/root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$tmp/root/var/lib/apt/lists/"* "$tmp/root/var/cache/apt/archives/"*.deb
    tar -C "$tmp/root" -c . | "${PODMAN[@]}" import - "$BASE" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
fi

step "podman build $IMAGE"
t0=$(date +%s)
"${PODMAN[@]}" build --pull=never --format docker -f docker/Dockerfile -t "$IMAGE" . >"${TMPDIR:-/tmp}/attnd-image-build.log" 2>&1 ||
    { tail -40 "${TMPDIR:-/tmp}/attnd-image-build.log"; exit 1; }
echo "built in $(($(date +%s) - t0)) s"
"${PODMAN[@]}" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE"

step "running the image"
ATTND_IMAGE=$IMAGE "$PYTHON" tests/deploy/docker_test.py
