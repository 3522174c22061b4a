"""Shipped task fixtures (package data under sandbox/fixtures/) and their built artefacts.

SWE-smith fixture repositories ship as plain file trees (no nested .git in this repo); their
mirrors with one branch per instance are built deterministically on first use into a cache
directory keyed by the fixtures' content hash (`THUNDERSYNC_CACHE`, default
/var/cache/thundersync when writable, else ~/.cache/thundersync).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from sandbox.envs.swesmith import SweInstance, build_mirror, load_instances

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SWESMITH_DIR = FIXTURES / "swesmith"
SWESMITH_INSTANCES = SWESMITH_DIR / "instances.jsonl"
TERMINAL_DIR = FIXTURES / "terminal"


def cache_dir() -> Path:
    env = os.environ.get("THUNDERSYNC_CACHE")
    if env:
        base = Path(env)
    elif os.access("/var/cache", os.W_OK):
        base = Path("/var/cache/thundersync")
    else:
        base = Path.home() / ".cache" / "thundersync"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _tree_hash(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def fixture_mirrors() -> Path:
    """Directory holding one git mirror per shipped fixture repository (built when missing)."""
    instances = load_instances(SWESMITH_INSTANCES)
    key = _tree_hash(SWESMITH_DIR / "repos", SWESMITH_INSTANCES)
    out = cache_dir() / f"swesmith-mirrors-{key}"
    if (out / ".complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    by_repo: dict[str, list[SweInstance]] = {}
    for inst in instances:
        by_repo.setdefault(inst.repo_name, []).append(inst)
    for name, insts in by_repo.items():
        build_mirror(SWESMITH_DIR / "repos" / name, insts, tmp / name)
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def terminal_tasks() -> list[Path]:
    return sorted(p for p in TERMINAL_DIR.iterdir() if p.is_dir()) if TERMINAL_DIR.exists() else []
