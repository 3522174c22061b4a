#!/usr/bin/env bash
# Create the secrets of a deployment with random values, never overwriting existing ones:
#   deploy/secrets/postgres_password, deploy/secrets/redis_password   (compose secrets)
#   deploy/env/service.env, deploy/env/cluster.env                    (from the *.example files)
#   deploy/k8s/secrets.local.yaml                                     (kubectl apply -f it)
# All are git-ignored (deploy/.gitignore). Usage: bash deploy/init-secrets.sh [DEPLOY_DIR]
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")" && pwd)}
umask 077
mkdir -p "$DIR/secrets" "$DIR/env"
rand() { python3 -c 'import secrets; print(secrets.token_hex(24))'; }

[ -s "$DIR/secrets/postgres_password" ] || rand > "$DIR/secrets/postgres_password"
[ -s "$DIR/secrets/redis_password" ] || rand > "$DIR/secrets/redis_password"
[ -s "$DIR/secrets/admin_token" ] || rand > "$DIR/secrets/admin_token"
PG=$(cat "$DIR/secrets/postgres_password")
RD=$(cat "$DIR/secrets/redis_password")
AT=$(cat "$DIR/secrets/admin_token")

render() {  # render SRC DST: fill the CHANGE_ME_* placeholders
  [ -s "$2" ] && return 0
  sed -e "s/CHANGE_ME_POSTGRES_PASSWORD/$PG/g" -e "s/CHANGE_ME_REDIS_PASSWORD/$RD/g" \
      -e "s/CHANGE_ME_ADMIN_TOKEN/$AT/g" "$1" > "$2.tmp"
  mv "$2.tmp" "$2"
  echo "init-secrets: wrote $2"
}
render "$DIR/env/service.env.example" "$DIR/env/service.env"
render "$DIR/env/cluster.env.example" "$DIR/env/cluster.env"
if [ -f "$DIR/k8s/secrets.yaml" ]; then
  render "$DIR/k8s/secrets.yaml" "$DIR/k8s/secrets.local.yaml"
fi
# The images run as uid 10001 / the postgres and redis users: compose secrets are bind-mounted files,
# so they must be readable inside the containers.
chmod 0644 "$DIR/secrets/"*
