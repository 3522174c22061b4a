# syntax=docker/dockerfile:1.7
# The GPU image: the image of the Ray head and GPU workers, so of everything a `tsrl train ... --ray`
# run starts there: the driver (head), learner ranks and the vLLM rollout / teacher replica actors
# (workers). ray[default]==2.60.0 from the lock (the same version as the service).
# Build from the repository root:
#   docker build -f deploy/docker/learner.Dockerfile -t thundersync/learner:0.1.0 .
# Two venvs, as the engine image and a developer machine (.venv + .venv-vllm): vLLM pins its own
# torch / transformers, and a replica actor starts it as a subprocess (TSRL_VLLM_PYTHON).
#   /opt/venv  thundersync + ray, torch==2.13.0 from the PyTorch CUDA index (TORCH_CUDA)
#   /opt/vllm  vllm==0.32.0 (pins torch==2.13.0, the same CUDA build)
# The torch wheels bundle the CUDA runtime libraries: the host needs the NVIDIA driver and
# container toolkit only.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS vllm
ARG TORCH_CUDA=cu130
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/vllm \
 && /opt/vllm/bin/pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" torch==2.13.0 \
 && /opt/vllm/bin/pip install vllm==0.32.0 torch==2.13.0 \
 && /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_CUDA=cu130
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" torch==2.13.0
COPY deploy/docker/requirements.lock /tmp/requirements.lock
RUN pip install -r /tmp/requirements.lock
# SkyRL (thundersync.skyrl: the switch, SkyRL runs through the service): its pinned needs, then
# skyrl itself past its metadata's Python / transformers bounds, as scripts/setup.sh does
COPY scripts/skyrl-requirements.txt /tmp/skyrl-requirements.txt
RUN grep -v '^skyrl==' /tmp/skyrl-requirements.txt > /tmp/skyrl-needs.txt \
 && pip install -r /tmp/skyrl-needs.txt \
 && pip install --no-deps --ignore-requires-python skyrl==0.4.0
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
RUN pip install --no-deps -e . && tsrl --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
# git + patch: SWE-smith grading applies patches in the local sandbox backend; bubblewrap: that
# backend's isolation (Docker sandboxes need the host's docker socket instead); wget: KubeRay's
# default readiness / liveness probes call it; gcc + libc6-dev: Triton (vLLM, torch.compile)
# compiles its launcher stubs at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bubblewrap=0.8.0-2+deb12u1 git=1:2.39.5-0+deb12u3 patch=2.7.6-7 procps=2:4.0.2-3 \
      wget=1.21.3-1+deb12u1 gcc=4:12.2.0-3 libc6-dev=2.36-9+deb12u14 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tsrl \
 && useradd --system --uid 10001 --gid tsrl --home-dir /home/tsrl --create-home tsrl \
 && mkdir -p /data /checkpoints /models && chown tsrl:tsrl /data /checkpoints /models
COPY --from=vllm /opt/vllm /opt/vllm
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/thundersync /opt/thundersync
# TSRL_VLLM_PYTHON: the interpreter rollout.vllm_server starts vLLM with (replica actors too).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TSRL_VLLM_PYTHON=/opt/vllm/bin/python \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    TSRL_DATA_DIR=/data
WORKDIR /opt/thundersync
USER 10001:10001
ENTRYPOINT ["tsrl"]
CMD ["train", "grpo-toy", "--run-dir", "/data/runs/manual"]
