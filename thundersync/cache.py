"""The machine-wide cache of built artefacts (fixture mirrors, the SmolLM2 wheel), race-safe.

`TSRL_CACHE` names it (CI points it at a fresh directory per run, so a race that only a cold
cache shows is caught); else /var/cache/thundersync when writable, else ~/.cache/thundersync.
Entries are built in a private temp dir beside their final name and moved into place with one
atomic rename, so threads and processes that race to build the same entry never see half of it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("TSRL_CACHE")
    if env:
        base = Path(env)
    elif os.access("/var/cache", os.W_OK):
        base = Path("/var/cache/thundersync")
    else:
        base = Path.home() / ".cache" / "thundersync"
    base.mkdir(parents=True, exist_ok=True)  # exist_ok: racing creators all succeed
    return base


def private_tmp(final: Path) -> Path:
    """A fresh directory beside `final` (same filesystem, so a rename into place is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
