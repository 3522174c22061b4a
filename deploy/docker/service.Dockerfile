# syntax=docker/dockerfile:1.7
# ThunderSync control plane: `tsrl serve` (REST API + dashboard) with the Ray job launcher.
# Build from the repository root:
#   docker build -f deploy/docker/service.Dockerfile -t thundersync/service:0.1.0 .
# CPU torch (the service imports the run config and launcher, never trains); every image keeps the
# venv at /opt/venv and the source at /opt/thundersync, so the launcher's driver command
# (/opt/venv/bin/tsrl train ...) is valid on the Ray head and workers too.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0
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
# Editable on purpose: the service runs Alembic from alembic/ beside service/ in the source tree.
RUN pip install --no-deps -e . && tsrl --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 tsrl \
 && useradd --system --uid 10001 --gid tsrl --home-dir /home/tsrl --create-home tsrl \
 && mkdir -p /data && chown tsrl:tsrl /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/thundersync /opt/thundersync
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TSRL_HOST=0.0.0.0 \
    TSRL_PORT=8000 \
    TSRL_DATA_DIR=/data
WORKDIR /opt/thundersync
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=5 \
  CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/api/v1/healthz', timeout=4)"]
ENTRYPOINT ["tsrl"]
CMD ["serve"]
