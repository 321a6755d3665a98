#!/bin/sh
# The local Debian base every stack image builds FROM (no image registry is needed): debootstrap's minbase of
# bookworm (python3 is 3.11, postgresql 15), imported into podman as $STACK_BASE_IMAGE. Built once and cached by
# name: a rerun finds the image and returns at once.
set -eu
name="${STACK_BASE_IMAGE:-localhost/draftsync-stack-base:bookworm}"
if podman image exists "$name"; then
    echo "base image $name: present"
    exit 0
fi
root="$(mktemp -d /var/tmp/draftsync-stack-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
# Leave no apt lists or caches in the image; each Dockerfile runs its own apt-get update.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name: built in $(( $(date +%s) - start )) s"
