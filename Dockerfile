# draftsync image for CPU work: the compose stack's CPU worker, webhook receiver and setup service, and the
# image of `draftsync-cpu` work pools of type docker or kubernetes. GPU workers use deploy/gpu.Dockerfile.
# Build from the repository root: docker build -t draftsync:latest .
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DO_NOT_TRACK=true \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DRAFTSYNC_WORKDIR=/var/lib/draftsync

# Flow runs start here (prefect.yaml's pull step): the deployments' entrypoints resolve against this folder.
WORKDIR /opt/draftsync

# torch first, as the CPU build, so that nothing pulls a multi-GB CUDA build into a CPU image.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md prefect.yaml ./
COPY requirements/draftsync-tested.txt ./requirements/
COPY draftsync ./draftsync
RUN pip install --no-cache-dir -c requirements/draftsync-tested.txt . && mkdir -p /var/lib/draftsync /etc/draftsync

COPY --chmod=755 deploy/docker-entrypoint.sh /usr/local/bin/draftsync-entrypoint
ENTRYPOINT ["draftsync-entrypoint"]
CMD ["prefect", "worker", "start", "--pool", "draftsync-cpu", "--type", "process"]
