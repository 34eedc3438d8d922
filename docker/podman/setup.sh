#!/bin/sh
# Podman on a Debian host with no Docker engine and no registry access, for `make images` and
# `make images-test` (run as root):
#   - Debian's podman, run with runc (crun fails on hosts with cgroups in hybrid mode), and
#     debootstrap;
#   - /etc/containers/containers.conf: runc, and no default ulimits (setting RLIMIT_NPROC fails
#     in containers here);
#   - the base images the Dockerfiles and compose file name, which cannot be pulled, stood in
#     for by images made from Debian bookworm's packages: python:3.11-slim (bookworm's Python is
#     3.11, with its headers as the official image has them: inductor builds against them) and, with `redis` as first argument, the Redis image of docker/compose.yaml.
# Each step is skipped when already done.
set -eu

BASE=docker.io/library/python:3.11-slim
REDIS=docker.io/library/redis:7.4-alpine
HERE=$(dirname "$0")

if [ "$(id -u)" != 0 ]; then
    echo "docker/podman/setup.sh: needs root (apt-get, debootstrap, /etc/containers)" >&2
    exit 1
fi

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi

if [ ! -e /etc/containers/containers.conf ]; then
    cat >/etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
elif ! grep -q '^runtime *= *"runc"' /etc/containers/containers.conf \
    || ! grep -q '^default_ulimits *= *\[\]' /etc/containers/containers.conf; then
    echo "/etc/containers/containers.conf exists without runtime = \"runc\" ([engine]) and" \
        "default_ulimits = [] ([containers]): add them" >&2
    exit 1
fi

if ! podman image exists "$BASE"; then
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
        bookworm "$rootfs" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["python3"]' - "$BASE"
fi

if [ "${1:-}" = redis ] && ! podman image exists "$REDIS"; then
    podman build --network=host --pull=never -f "$HERE/redis.Dockerfile" -t "$REDIS" "$HERE"
fi
