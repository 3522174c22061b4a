# syntax=docker/dockerfile:1.7
# vLLM on CUDA behind `tsrl teacher serve` / `tsrl vllm serve`: a standalone scoring or rollout
# server outside Ray, e.g. one a run attaches to with rollout.vllm.urls. Runs on the cluster do
# not need it: their replicas are Ray actors in the GPU image (learner.Dockerfile).
# Build from the repository root:
#   docker build -f deploy/docker/engine.Dockerfile -t thundersync/engine:0.1.0 .
# Two venvs, as on a developer machine (.venv + .venv-vllm): vLLM pins its own torch/transformers
# and runs only as a subprocess that tsrl talks to over HTTP.
#   /opt/vllm  vllm==0.32.0 (pins torch==2.13.0, CUDA build from the PyTorch index)
#   /opt/venv  thundersync with CPU torch (tsrl only starts and watches the server)
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS vllm
ARG TORCH_CUDA=cu130
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/vllm \
 && /opt/vllm/bin/pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" torch==2.13.0 \
 && /opt/vllm/bin/pip install vllm==0.32.0 torch==2.13.0 \
 && /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec

FROM ${PYTHON_IMAGE} AS tsrl
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY deploy/docker/requirements.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock
WORKDIR /opt/thundersync
COPY pyproject.toml README.md alembic.ini ./
COPY alembic ./alembic
COPY thundersync ./thundersync
COPY learner ./learner
COPY service ./service
COPY sandbox ./sandbox
COPY teacher ./teacher
COPY rollout ./rollout
COPY bus ./bus
COPY bench ./bench
COPY recipes ./recipes
RUN pip install --no-deps -e . && tsrl teacher serve --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
# gcc + libc6-dev: Triton (vLLM) compiles its launcher stubs at run time
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc=4:12.2.0-3 libc6-dev=2.36-9+deb12u14 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tsrl \
 && useradd --system --uid 10001 --gid tsrl --home-dir /home/tsrl --create-home tsrl \
 && mkdir -p /models /checkpoints /data && chown tsrl:tsrl /models /checkpoints /data
COPY --from=vllm /opt/vllm /opt/vllm
COPY --from=tsrl /opt/venv /opt/venv
COPY --from=tsrl /opt/thundersync /opt/thundersync
# TSRL_VLLM_PYTHON: the interpreter rollout.vllm_server starts vLLM with.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TSRL_VLLM_PYTHON=/opt/vllm/bin/python \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1
WORKDIR /opt/thundersync
USER 10001:10001
EXPOSE 8100
HEALTHCHECK --interval=20s --timeout=5s --start-period=300s --retries=5 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('TSRL_ENGINE_PORT', '8100'), timeout=4)"]
ENTRYPOINT ["tsrl"]
CMD ["teacher", "serve", "--model", "/models/teacher", "--port", "8100", "--dtype", "bfloat16"]
