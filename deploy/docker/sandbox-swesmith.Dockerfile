# syntax=docker/dockerfile:1.7
# Base image of SWE-smith task sandboxes (sandbox backend `docker`): python3, pytest, git, patch and
# an unprivileged user. A task image adds its repository at /testbed (SWE-smith layout) on top:
#   FROM thundersync/sandbox-swesmith:bookworm
#   COPY --chown=agent:agent repo/ /testbed/
# Build: docker build -f deploy/docker/sandbox-swesmith.Dockerfile -t thundersync/sandbox-swesmith:bookworm deploy/docker
# No Python packages from PyPI here: Debian's pytest keeps the image reproducible from apt alone.
FROM debian:12.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3=3.11.2-1+b1 python3-pytest=7.2.1-2 git=1:2.39.5-0+deb12u3 patch=2.7.6-7 \
      procps=2:4.0.2-3 ca-certificates=20250419~deb12u2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 agent \
 && useradd --uid 1000 --gid agent --home-dir /home/agent --create-home --shell /bin/bash agent \
 && mkdir -p /testbed && chown agent:agent /testbed \
 && git config --system user.email agent@sandbox.invalid \
 && git config --system user.name agent \
 && git config --system --add safe.directory /testbed
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /testbed
USER 1000:1000
CMD ["/bin/bash"]
