"""deploy/gpu-smoke.sh plumbing (with a stand-in tsrl: no GPU here) and the shell scripts parse."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from deploy_helpers import DEPLOY, ROOT
from test_deploy_commands import resolve

STUB = """#!/usr/bin/env bash
# stand-in tsrl: `bench gpu` prints its JSON line
case "$*" in
  bench\\ gpu*) echo "log"; echo '{"ok": true, "args": "'"$*"'"}'; exit 0;;
esac
exit 2
"""
PYTEST_STUB = """#!/usr/bin/env bash
echo "1 passed"; echo '{"pytest_args": "'"$*"'"}'; exit 0
"""


@pytest.mark.parametrize("script", ["gpu-smoke.sh", "init-secrets.sh"])
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(DEPLOY / script)]).returncode == 0
    assert (
        subprocess.run(["bash", "-n", str(ROOT / "scripts/setup.d/50-deploy.sh")]).returncode == 0
    )


def _stub(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _smoke(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    full = {**os.environ, "TSRL": str(_stub(tmp_path / "tsrl", STUB)), **env}
    r = subprocess.run(
        ["bash", str(DEPLOY / "gpu-smoke.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "out" / "gpu-smoke.json").read_text()) == doc
    return r, doc


def test_gpu_smoke_without_cuda_runs_nothing_in_its_place(tmp_path: Path) -> None:
    r, doc = _smoke(tmp_path)
    assert doc["cuda"] is False and doc["ok"] is False and r.returncode == 1  # no GPU here
    assert {s["rc"] for s in doc["steps"].values()} == {-1}
    assert all("no CUDA" in s["note"] for s in doc["steps"].values())


def test_gpu_smoke_runs_the_cuda_tests_and_bench_and_reports_json(tmp_path: Path) -> None:
    pytest_stub = _stub(tmp_path / "pytest", PYTEST_STUB)
    r, doc = _smoke(tmp_path, GPU_SMOKE_FORCE="1", PYTEST=str(pytest_stub))
    steps = doc["steps"]
    assert (
        steps["gpu-tests"]["rc"] == 0 and "tests/gpu" in steps["gpu-tests"]["result"]["pytest_args"]
    )
    assert steps["bench-gpu"]["rc"] == 0
    assert "bench gpu --device cuda" in steps["bench-gpu"]["result"]["args"]
    assert doc["ok"] is False and r.returncode == 1  # every step passed, but there is no CUDA


def test_gpu_smoke_without_tsrl_fails_clearly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TSRL"}
    env["PATH"] = "/usr/bin:/bin"
    fake = tmp_path / "deploy"
    fake.mkdir()
    (fake / "gpu-smoke.sh").write_text((DEPLOY / "gpu-smoke.sh").read_text())
    r = subprocess.run(
        ["bash", str(fake / "gpu-smoke.sh")], capture_output=True, text=True, env=env, timeout=30
    )
    assert r.returncode == 2 and "no tsrl command" in r.stderr


def test_command_check_catches_a_wrong_flag() -> None:
    path, cmd, rest = resolve(["teacher", "serve", "--model", "m", "--no-such-flag"])
    assert path == ("teacher", "serve")
    opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    assert "--no-such-flag" not in opts and "--model" in opts
    assert resolve(["no-such-command"])[1] is None


def test_a_gpu_test_that_skips_fails_where_cuda_is_present(tmp_path: Path) -> None:
    """tests/gpu/conftest.py's hook, run by pytest itself on a test that skips, with CUDA
    declared present (a CPU machine cannot have it): the run fails and says why."""
    import shutil
    import sys

    shutil.copy(ROOT / "tests" / "gpu" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_x():\n    pytest.skip('no CUDA vLLM here')\n"
    )
    patch = "import torch; torch.cuda.is_available = lambda: True\n"
    (tmp_path / "sitecustomize.py").write_text(patch)

    def pytest_here(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)

    res = pytest_here({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 1 and "may not pass by skipping" in res.stdout, res.stdout
    res = pytest_here(dict(os.environ))  # no CUDA: the skip stands
    assert res.returncode == 0 and "1 skipped" in res.stdout, res.stdout
