# MLflow tracking server (3.17.2, the version draftsync is tested with) with the Postgres driver (psycopg 3,
# which SQLAlchemy 2.1 takes for postgresql:// URLs) and its
# basic-auth app. Build from the repository root: docker build -f deploy/mlflow.Dockerfile -t draftsync-mlflow:3.17.2 .
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
    MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini

RUN if ! command -v python3 > /dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv
# Within the versions draftsync is tested with (requirements/draftsync-tested.txt), and nothing broken among them.
COPY requirements/draftsync-tested.txt /tmp/tested.txt
RUN pip install -c /tmp/tested.txt "mlflow[auth]==3.17.2" "psycopg[binary]==3.3.9" \
 && rm /tmp/tested.txt \
 && pip check

# The basic-auth app's settings (no secret in them): nobody may do anything without a login, and the users live
# in SQLite on the mlflow-auth volume. The admin's name and password come from MLFLOW_AUTH_ADMIN_USERNAME and
# MLFLOW_AUTH_ADMIN_PASSWORD the first time the server starts on an empty volume.
RUN mkdir -p /etc/mlflow /var/lib/mlflow-auth /mlartifacts \
 && printf '%s\n' '[mlflow]' \
        'default_permission = NO_PERMISSIONS' \
        'database_uri = sqlite:////var/lib/mlflow-auth/basic_auth.db' \
        'admin_username = admin' \
        'authorization_function = mlflow.server.auth:authenticate_request_basic_auth' \
        > /etc/mlflow/basic_auth.ini
