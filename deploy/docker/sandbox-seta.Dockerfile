# syntax=docker/dockerfile:1.7
# Base image of SETA / Terminal-Bench (TB1) and Harbor (TB2) task sandboxes (sandbox backend
# `docker`): python3, pytest, git, patch, tmux and an unprivileged user. Tasks work in /app;
# run-tests.sh / tests/test.sh write the Harbor verdict to /logs/verifier/reward.json|reward.txt.
# A task's own Dockerfile builds on it:
#   FROM thundersync/sandbox-seta:bookworm
#   COPY --chown=agent:agent . /app/
# Build: docker build -f deploy/docker/sandbox-seta.Dockerfile -t thundersync/sandbox-seta:bookworm deploy/docker
FROM debian:12.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3=3.11.2-1+b1 python3-pytest=7.2.1-2 git=1:2.39.5-0+deb12u3 patch=2.7.6-7 \
      procps=2:4.0.2-3 tmux=3.3a-3 ca-certificates=20250419~deb12u2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 agent \
 && useradd --uid 1000 --gid agent --home-dir /home/agent --create-home --shell /bin/bash agent \
 && mkdir -p /app /logs/verifier /logs/agent && chown -R agent:agent /app /logs
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TEST_DIR=/tests
WORKDIR /app
USER 1000:1000
CMD ["/bin/bash"]
