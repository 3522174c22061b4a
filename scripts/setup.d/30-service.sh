#!/usr/bin/env bash
# Control-plane prerequisites (idempotent, run as root by `make setup` and CI):
#  - Debian `chromium` for the dashboard's end-to-end tests. Playwright for Python (a dev extra in
#    pyproject.toml) drives it through executable_path=/usr/bin/chromium; `playwright install` is
#    never run (it downloads browsers from the internet, which these machines cannot reach).
# Without root or apt-get the script only reports what is missing and exits 0 (the browser test
# then fails with a message naming this script).
set -euo pipefail
PKGS="chromium fonts-dejavu-core"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  command -v chromium >/dev/null || echo "30-service: chromium missing (run this script as root)" >&2
  exit 0
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "30-service: installing$missing"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
