# draftsync GPU worker: vLLM's official image (CUDA, torch, vLLM) with draftsync installed on top. The compose
# stack's worker-gpu, and the image of `draftsync-gpu` work pools of type docker or kubernetes.
# Build from the repository root: docker build -f deploy/gpu.Dockerfile -t draftsync-gpu:latest .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
FROM ${VLLM_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    DO_NOT_TRACK=true \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DRAFTSYNC_WORKDIR=/var/lib/draftsync

WORKDIR /opt/draftsync

COPY pyproject.toml README.md prefect.yaml ./
COPY draftsync ./draftsync
# Keep the image's CUDA builds of torch and its companions (and vLLM itself) exactly as vLLM was built against
# them: they become constraints while draftsync's own dependencies go in.
RUN { python3 -m pip freeze | grep -iE '^(torch|torchvision|torchaudio|triton|xformers|vllm)==' || true; } \
        > /tmp/keep-from-vllm.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/keep-from-vllm.txt . \
 && rm /tmp/keep-from-vllm.txt \
 && mkdir -p /var/lib/draftsync /etc/draftsync \
 && python3 -c "import torch, draftsync.cli.app; print('torch', torch.__version__)"

COPY --chmod=755 deploy/docker-entrypoint.sh /usr/local/bin/draftsync-entrypoint
# The vLLM image's entrypoint is `vllm serve`; draftsync starts vLLM itself, as the rollout flow decides.
ENTRYPOINT ["draftsync-entrypoint"]
CMD ["prefect", "worker", "start", "--pool", "draftsync-gpu", "--type", "process"]
