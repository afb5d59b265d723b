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

export PATH=$PATH:/usr/sbin:/sbin  # runc and debootstrap live there
step() { echo "== $*"; }

# command -> Debian package providing it, installed only when the command is missing
need_pkgs=""
for cp in podman:podman runc:runc debootstrap:debootstrap node:nodejs npm:npm \
          docker-compose:docker-compose; do
    command -v "${cp%%:*}" >/dev/null 2>&1 || need_pkgs="$need_pkgs ${cp#*:}"
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

step "compose file (docker-compose config checks it against the Compose schema; no engine needed)"
docker-compose -f docker/compose.yaml config -q

step "manifests"
"$PYTHON" tests/deploy/validate_manifests.py

if ! "${PODMAN[@]}" image exists "$BASE"; then
    step "making $BASE with debootstrap (no registry needed)"
    bash tests/deploy/make_base_image.sh "$BASE"
fi

step "podman build $IMAGE"
# The build stage is tagged too ($IMAGE-build), so that it stays cached and
# the images a previous run left can be removed by id, and only those.
old_ids=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" "$IMAGE-build" 2>/dev/null || true)
log=${TMPDIR:-/tmp}/attnd-image-build.log
t0=$(date +%s)
{ "${PODMAN[@]}" build --pull=never --format docker --target build -f docker/Dockerfile \
      -t "$IMAGE-build" . &&
  "${PODMAN[@]}" build --pull=never --format docker -f docker/Dockerfile -t "$IMAGE" .; } >"$log" 2>&1 ||
    { tail -40 "$log"; exit 1; }
echo "built in $(($(date +%s) - t0)) s"
new_ids=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" "$IMAGE-build")
for id in $old_ids; do
    case "$new_ids" in *"$id"*) ;; *) "${PODMAN[@]}" rmi "$id" >/dev/null 2>&1 || true ;; esac
done
"${PODMAN[@]}" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE"

step "running the image"
ATTND_IMAGE=$IMAGE "$PYTHON" tests/deploy/docker_test.py
