#!/usr/bin/env bash
# Refresh apt lists at most once a day (other setup.d parts install from them).
set -euo pipefail
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
    apt-get update -qq >/dev/null
  fi
fi
