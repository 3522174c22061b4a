"""The distribution is one import root: the wheel built from a clean checkout holds `thundersync`
and its dist-info only, ships its data (recipes, migrations, dashboard, task fixtures) inside the
package, and works when installed away from the checkout."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OLD_ROOTS = {
    "tsrl",
    "learner",
    "service",
    "sandbox",
    "teacher",
    "rollout",
    "bus",
    "bench",
    "driver",
}


def _clean_copy(dest: Path) -> None:
    """What a clean clone holds: tracked files and untracked, not ignored ones (links kept)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    _clean_copy(src)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (whl,) = (root / "dist").glob("thundersync-*.whl")
    return whl


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"thundersync"}, sorted(tops)
    assert len(dist_info) == 1
    top_level = zipfile.ZipFile(wheel).read(f"{dist_info.pop()}/top_level.txt").decode().split()
    assert top_level == ["thundersync"]


def test_wheel_ships_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in (
        "thundersync/recipes/grpo-toy.yaml",
        "thundersync/recipes/grpo-smollm2-terminal.yaml",
        "thundersync/service/migrations/env.py",
        "thundersync/service/migrations/versions/0001_initial_schema.py",
        "thundersync/service/web/index.html",
        "thundersync/service/web/static/app.js",
        "thundersync/rollout/fixtures/toy_calc.jsonl",
        "thundersync/sandbox/fixtures/swesmith/instances.jsonl",
    ):
        assert want in names, want


def test_installed_wheel_finds_its_data_through_the_package(wheel: Path, tmp_path: Path) -> None:
    """Installed into a bare folder and run from elsewhere: nothing is read from the checkout."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    probe = (
        "import thundersync, thundersync.learner, thundersync.service\n"
        "from thundersync.config import RECIPES_DIR, load_run_config\n"
        "from thundersync.service.db import ALEMBIC_DIR\n"
        "assert load_run_config('grpo-toy').objective == 'grpo'\n"
        "assert (ALEMBIC_DIR / 'env.py').is_file()\n"
        "print(thundersync.__file__, RECIPES_DIR)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert str(REPO) not in out.stdout and str(target) in out.stdout, out.stdout


def test_no_module_imports_an_old_top_level_name() -> None:
    """`import learner` would work in a checkout (its folder is on sys.path) but not installed."""
    bad = []
    paths = [
        Path(d) / f
        for d, _, files in os.walk(REPO / "thundersync", followlinks=True)
        for f in files
        if f.endswith(".py") and "fixtures" not in d and "migrations" not in d
    ]
    assert len(paths) > 150  # the links were followed
    for path in sorted(paths):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            bad += [f"{path}:{node.lineno}: {m}" for m in mods if m.split(".")[0] in OLD_ROOTS]
    assert not bad, "\n".join(bad)
