"""Shipped task fixtures (package data under sandbox/fixtures/) and their built artefacts.

SWE-smith fixture repositories ship as plain file trees (no nested .git in this repo); their
mirrors with one branch per instance are built deterministically on first use into a cache
directory keyed by the fixtures' content hash, in the artefact cache of `thundersync.cache`.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thundersync.cache import cache_root, private_tmp
from thundersync.sandbox.envs.swesmith import SweInstance, build_mirror, load_instances

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SWESMITH_DIR = FIXTURES / "swesmith"
SWESMITH_INSTANCES = SWESMITH_DIR / "instances.jsonl"
TERMINAL_DIR = FIXTURES / "terminal"


def _tree_hash(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:  # a file root counts as itself (rglob of a file yields nothing)
        for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _built_once(out: Path, build: Callable[[Path], None]) -> Path:
    """The cache entry `out`, built by `build(tmp)` when missing.

    Safe when threads and processes race to build it: each builds in a temp dir of its own
    beside the cache entry and renames it into place; the rename is atomic and fails when the
    entry exists, so a loser discards its copy and uses the winner's.
    """
    if (out / ".complete").exists():
        return out
    tmp = private_tmp(out)
    try:
        build(tmp)
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


def fixture_mirrors() -> Path:
    """Directory holding one git mirror per shipped fixture repository (built when missing)."""

    def build(tmp: Path) -> None:
        by_repo: dict[str, list[SweInstance]] = {}
        for inst in load_instances(SWESMITH_INSTANCES):
            by_repo.setdefault(inst.repo_name, []).append(inst)
        for name, insts in by_repo.items():
            build_mirror(SWESMITH_DIR / "repos" / name, insts, tmp / name)

    key = _tree_hash(SWESMITH_DIR / "repos", SWESMITH_INSTANCES)
    return _built_once(cache_root() / f"swesmith-mirrors-{key}", build)


def terminal_tasks(root: Path = TERMINAL_DIR) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def builtin_task_dir(name: str) -> Path:
    """The directory of a built-in task set (`env.tasks: terminal-easy`, see
    `thundersync.config_env.BUILTIN_TASK_SETS`): a folder of its own under sandbox/fixtures/."""
    from thundersync.config_env import BUILTIN_TASK_SETS

    if name not in BUILTIN_TASK_SETS:
        raise KeyError(f"no built-in task set {name!r}: use one of {sorted(BUILTIN_TASK_SETS)}")
    return FIXTURES / name


# ---- SWE-smith instance images of the fixture repositories ------------------------------------
# Named as published SWE-smith images are (`swesmith.x86_64.<owner>__<repo>.<commit>`); nothing can
# be pulled here, so the docker backend builds them on first use from the local sandbox base.
FIXTURE_IMAGE_PREFIX = "swesmith.x86_64.thundersync-fixtures__"
_CONDA_ACTIVATE = "conda() { export PATH=/opt/miniconda3/envs/testbed/bin:$PATH; }\n"
_IMAGE_DOCKERFILE = (
    "FROM thundersync-sandbox:bookworm\nCOPY testbed /testbed\nCOPY conda /opt/miniconda3\n"
)


def is_fixture_image(image_name: str) -> bool:
    return image_name.startswith(FIXTURE_IMAGE_PREFIX)


def swesmith_image_context(repo_name: str) -> Path:
    """Build context of a fixture repository's image, in SWE-smith's layout: the clean repo at
    /testbed whose clone holds every instance branch (as a published image's does: the env never
    shows that history to the agent), and a conda env `testbed` (a stand-in whose python is the
    base image's). Cached by the fixtures' content, built atomically like `fixture_mirrors`."""
    src = SWESMITH_DIR / "repos" / repo_name
    if not src.is_dir():
        raise FileNotFoundError(f"{SWESMITH_DIR / 'repos'}: no fixture repository {repo_name!r}")

    def build(tmp: Path) -> None:
        insts = [i for i in load_instances(SWESMITH_INSTANCES) if i.repo_name == repo_name]
        build_mirror(src, insts, tmp / "testbed")
        activate = tmp / "conda" / "bin" / "activate"
        activate.parent.mkdir(parents=True)
        activate.write_text(_CONDA_ACTIVATE)
        activate.chmod(0o755)
        env_bin = tmp / "conda" / "envs" / "testbed" / "bin"
        env_bin.mkdir(parents=True)
        for name in ("python", "python3"):
            (env_bin / name).symlink_to("/usr/bin/python3")
        (tmp / "Dockerfile").write_text(_IMAGE_DOCKERFILE)

    key = _tree_hash(src, SWESMITH_INSTANCES)
    return _built_once(cache_root() / f"swesmith-image-{repo_name}-{key}", build)


def ensure_swesmith_image(client: Any, image_name: str) -> str:
    """Build (once per content, `sandbox.images.ensure_image`) the fixture image `image_name`
    names and tag it so; returns `image_name`."""
    from thundersync.sandbox.images import ensure_image

    if not is_fixture_image(image_name):
        raise ValueError(f"{image_name!r} is not a fixture image ({FIXTURE_IMAGE_PREFIX}...)")
    repo_name = image_name[len(FIXTURE_IMAGE_PREFIX) :].split(":")[0].rsplit(".", 1)[0]
    ctx = swesmith_image_context(repo_name)
    built = ensure_image(client, f"swesmith-{repo_name}", ctx, ctx / "Dockerfile")
    repo, _, tag = image_name.partition(":")
    client.images.get(built).tag(repo, tag or "latest")
    return image_name
