"""Shipped task fixtures (package data under sandbox/fixtures/) and their built artefacts.

SWE-smith fixture repositories ship as plain file trees (no nested .git in this repo); their
mirrors with one branch per instance are built deterministically on first use into a cache
directory keyed by the fixtures' content hash, in the artefact cache of `tsrl.cache`.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sandbox.envs.swesmith import SweInstance, build_mirror, load_instances
from tsrl.cache import cache_root, private_tmp

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SWESMITH_DIR = FIXTURES / "swesmith"
SWESMITH_INSTANCES = SWESMITH_DIR / "instances.jsonl"
TERMINAL_DIR = FIXTURES / "terminal"


def _tree_hash(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def fixture_mirrors() -> Path:
    """Directory holding one git mirror per shipped fixture repository (built when missing).

    Safe when threads and processes race to build it: each builds in a temp dir of its own
    beside the cache entry and renames it into place; the rename is atomic and fails when the
    entry exists, so a loser discards its copy and uses the winner's.
    """
    instances = load_instances(SWESMITH_INSTANCES)
    key = _tree_hash(SWESMITH_DIR / "repos", SWESMITH_INSTANCES)
    out = cache_root() / f"swesmith-mirrors-{key}"
    if (out / ".complete").exists():
        return out
    tmp = private_tmp(out)
    try:
        by_repo: dict[str, list[SweInstance]] = {}
        for inst in instances:
            by_repo.setdefault(inst.repo_name, []).append(inst)
        for name, insts in by_repo.items():
            build_mirror(SWESMITH_DIR / "repos" / name, insts, tmp / name)
        (tmp / ".complete").write_text("ok\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache entry is shared
        try:
            tmp.rename(out)
        except OSError:  # another thread or process won the race
            if not (out / ".complete").exists():
                raise OSError(
                    f"{out} exists but is incomplete (no .complete): remove it and retry"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still there only when this one lost
    return out


def terminal_tasks() -> list[Path]:
    return sorted(p for p in TERMINAL_DIR.iterdir() if p.is_dir()) if TERMINAL_DIR.exists() else []
