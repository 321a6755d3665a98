#!/bin/bash
# Builds every image of the compose stack with podman from the local Debian base (tools/stack/base-image.sh), so
# that nothing comes from an image registry: the CPU image, MLflow, Prefect, and the stand-ins for postgres:15 and
# Mailpit, tagged with the names docker-compose.yml uses. pip takes this machine's own wheels, package indexes and
# CA bundle when they exist (mounted into the build, never copied into an image), so torch is the CPU build.
# Layers are cached: a rerun with nothing changed takes seconds. Logs: $STACK_LOG_DIR/build-*.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
logs="${STACK_LOG_DIR:-/tmp/draftsync-stack}"
mkdir -p "$logs"
args=(--build-arg "BASE_IMAGE=${STACK_BASE_IMAGE:-localhost/draftsync-stack-base:bookworm}")
if [ -d /opt/wheels ]; then
    args+=(-v /opt/wheels:/opt/wheels:ro --build-arg PIP_FIND_LINKS=/opt/wheels)
fi
indexes=()
for index in /opt/pypi /opt/pypi-more; do
    if [ -d "$index/simple" ]; then
        args+=(-v "$index:$index:ro")
        indexes+=("file://$index/simple")
    fi
done
if [ ${#indexes[@]} -gt 0 ]; then
    args+=(--build-arg "PIP_EXTRA_INDEX_URL=${indexes[*]}")
    # torch from the wheels folder (its CPU build), not from download.pytorch.org
    args+=(--build-arg "TORCH_INDEX_URL=${indexes[0]}")
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then  # this machine's CA bundle, for a proxy between pip and PyPI
    args+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/pip-ca.crt:ro --build-arg PIP_CERT=/etc/pip-ca.crt)
fi

build() {  # TAG DOCKERFILE CONTEXT
    local start log
    start=$(date +%s)
    log="$logs/build-$(basename "$2" .Dockerfile).log"
    if ! podman build "${args[@]}" -t "$1" -f "$2" "$3" > "$log" 2>&1; then
        tail -40 "$log" >&2
        echo "building $1 from $2 failed (log: $log)" >&2
        exit 1
    fi
    echo "image $1: $(( $(date +%s) - start )) s"
}
build localhost/draftsync:latest Dockerfile .
build localhost/draftsync-mlflow:3.17.2 deploy/mlflow.Dockerfile .
build localhost/draftsync-prefect:3.9.1 deploy/prefect.Dockerfile .
build docker.io/library/postgres:15 tools/stack/images/postgres.Dockerfile tools/stack/images
build docker.io/axllent/mailpit:v1.27 tools/stack/images/mailpit.Dockerfile tools/stack/images
