# draftsync worker image (CPU). GPU workers use vLLM's official image with draftsync installed on top.
FROM python:3.11-slim
WORKDIR /opt/draftsync
COPY pyproject.toml README.md ./
COPY draftsync ./draftsync
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir .
ENV DO_NOT_TRACK=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
