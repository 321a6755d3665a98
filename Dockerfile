# draftsync image for CPU work: the compose stack's CPU worker, webhook receiver, setup service and (profile
# `cpu`) the serving service on draftsync's CPU reference server, and the image of `draftsync-cpu` work pools of
# type docker or kubernetes. GPU workers use deploy/gpu.Dockerfile.
# Build from the repository root: docker build -t draftsync:latest .
# BASE_IMAGE is any Debian-like image; one without Python gets Debian's python3 (`make test-stack` builds on a
# bare Debian bookworm). TORCH_INDEX_URL is where the CPU build of torch comes from.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional local package mirrors and CA bundle for the build (pip reads them from the environment); unset by default.
ARG PIP_FIND_LINKS
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DO_NOT_TRACK=true \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DRAFTSYNC_WORKDIR=/var/lib/draftsync \
    PATH=/opt/venv/bin:$PATH

# Everything goes into one venv, whichever Python the base brings.
RUN if ! command -v python3 > /dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv

# Flow runs start here (prefect.yaml's pull step): the deployments' entrypoints resolve against this folder.
WORKDIR /opt/draftsync

# torch first, as the CPU build, so that nothing pulls a multi-GB CUDA build into a CPU image.
RUN PIP_INDEX_URL="${TORCH_INDEX_URL}" pip install torch==${TORCH_VERSION}

# The dependencies first, within the versions CI last passed with (requirements/draftsync-tested.txt), through an
# empty package: this layer stays cached while only draftsync's code changes.
COPY pyproject.toml README.md ./
COPY requirements/draftsync-tested.txt ./requirements/
RUN mkdir draftsync && touch draftsync/__init__.py \
 && pip install -c requirements/draftsync-tested.txt . \
 && rm -rf draftsync
# Then draftsync itself, and nothing broken among them all.
COPY prefect.yaml ./
COPY draftsync ./draftsync
RUN pip install --no-deps -c requirements/draftsync-tested.txt . \
 && pip check \
 && python -c "import draftsync.cli.app" \
 && mkdir -p /var/lib/draftsync /etc/draftsync

COPY --chmod=755 deploy/docker-entrypoint.sh /usr/local/bin/draftsync-entrypoint
ENTRYPOINT ["draftsync-entrypoint"]
CMD ["prefect", "worker", "start", "--pool", "draftsync-cpu", "--type", "process"]
