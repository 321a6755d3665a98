# draftsync GPU image: vLLM's official image (CUDA, torch, vLLM) with draftsync installed on top. The compose
# stack's worker-gpu and serving-gpu, and the image of `draftsync-gpu` work pools of type docker or kubernetes.
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
COPY requirements/draftsync-tested.txt ./requirements/
COPY draftsync ./draftsync
COPY deploy/vllm-cpu-plugin/pyproject.toml deploy/vllm-cpu-plugin/draftsync_vllm_cpu.py \
     deploy/vllm-cpu-plugin/draftsync_hidden_states.py ./deploy/vllm-cpu-plugin/
# draftsync's vLLM plugin brings the hidden-states connector a sync's states come through (its CPU fix does nothing
# on a GPU build). draftsync within the versions CI last passed with (requirements/draftsync-tested.txt), except that
# everything the vLLM image already has (its CUDA torch and companions, vLLM and each package at the version vLLM was built with)
# stays as it is: the image's versions become constraints and win, and the tested pins of those packages are taken
# out. The build fails unless vLLM and draftsync import together and pip finds nothing broken.
RUN python3 -m pip freeze --exclude-editable | grep '==' > /tmp/keep-from-vllm.txt \
 && awk -F'==' 'function key(n) { n = tolower(n); gsub(/[_.]/, "-", n); return n } \
        NR == FNR { have[key($1)]; next } /^[A-Za-z0-9]/ && !(key($1) in have)' \
        /tmp/keep-from-vllm.txt requirements/draftsync-tested.txt > /tmp/tested-without-vllm.txt
RUN python3 -m pip install --no-cache-dir -c /tmp/keep-from-vllm.txt -c /tmp/tested-without-vllm.txt . \
 && rm /tmp/keep-from-vllm.txt /tmp/tested-without-vllm.txt \
 && python3 -m pip install --no-cache-dir --no-deps ./deploy/vllm-cpu-plugin \
 && python3 -m pip check \
 && python3 -c "import vllm, draftsync.cli.app, draftsync_hidden_states" \
 && mkdir -p /var/lib/draftsync /etc/draftsync \
 && python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"

COPY --chmod=755 deploy/docker-entrypoint.sh /usr/local/bin/draftsync-entrypoint
# The vLLM image's entrypoint is `vllm serve`; draftsync starts vLLM itself, as the rollout flow decides.
ENTRYPOINT ["draftsync-entrypoint"]
CMD ["prefect", "worker", "start", "--pool", "draftsync-gpu", "--type", "process"]
