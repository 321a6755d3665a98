# Prefect server (3.9.1, the version draftsync is tested with) with the asyncpg driver for Postgres.
# Build from the repository root: docker build -f deploy/prefect.Dockerfile -t draftsync-prefect:3.9.1 .
# BASE_IMAGE is any Debian-like image; one without Python gets Debian's python3.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG PIP_FIND_LINKS
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH \
    DO_NOT_TRACK=true \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_HOME=/var/lib/prefect

RUN if ! command -v python3 > /dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv
# Within the versions draftsync is tested with (requirements/draftsync-tested.txt), and nothing broken among them.
COPY requirements/draftsync-tested.txt /tmp/tested.txt
RUN pip install -c /tmp/tested.txt prefect==3.9.1 asyncpg==0.32.0 \
 && rm /tmp/tested.txt \
 && pip check \
 && mkdir -p /var/lib/prefect

CMD ["prefect", "server", "start", "--host", "0.0.0.0", "--port", "4200"]
