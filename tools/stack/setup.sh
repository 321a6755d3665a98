#!/bin/sh
# Set-up of `make test-stack`: podman (runc, netavark/aardvark-dns for names on the stack's network), debootstrap,
# and podman-compose in a venv of its own (.venv-stack; Debian's 1.0.3 lacks env_file `required` and profiles
# handling the compose file needs), then the local Debian base image. Idempotent: a rerun only checks.
# podman reads tools/stack/containers.conf (CONTAINERS_CONF, exported by the Makefile target).
set -eu
cd "$(dirname "$0")/../.."
missing=""
for tool in podman:podman runc:runc debootstrap:debootstrap aardvark-dns:aardvark-dns netavark:netavark; do
    command -v "${tool%%:*}" > /dev/null 2>&1 || [ -x "/usr/lib/podman/${tool%%:*}" ] || missing="$missing ${tool#*:}"
done
if [ -n "$missing" ]; then
    echo "installing$missing"
    apt-get update -q > /dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing > /dev/null
fi
venv="${STACK_VENV:-.venv-stack}"
if ! "$venv/bin/podman-compose" version > /dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "podman-compose==1.6.0"
fi
tools/stack/base-image.sh
