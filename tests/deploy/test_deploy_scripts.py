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
# stand-in tsrl: equivalence with --dtype, no speedup command
case "$*" in
  "bench equivalence --help") echo "--objective --updates --dtype --json"; exit 0;;
  "bench speedup --help") exit 2;;
  bench\\ equivalence*) echo "table"; echo '{"max_param_gap": 0.0, "args": "'"$*"'"}'; exit 0;;
esac
exit 2
"""


@pytest.mark.parametrize("script", ["gpu-smoke.sh", "init-secrets.sh"])
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(DEPLOY / script)]).returncode == 0
    assert (
        subprocess.run(["bash", "-n", str(ROOT / "scripts/setup.d/50-deploy.sh")]).returncode == 0
    )


def test_gpu_smoke_reports_steps_as_json(tmp_path: Path) -> None:
    stub = tmp_path / "tsrl"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {**os.environ, "TSRL": str(stub), "STEP_TIMEOUT": "20"}
    r = subprocess.run(
        ["bash", str(DEPLOY / "gpu-smoke.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["cuda"] is False and doc["ok"] is False and r.returncode == 1  # no GPU here
    steps = doc["steps"]
    assert steps["equivalence-grpo-fp32"]["rc"] == 0
    assert steps["equivalence-grpo-fp32"]["result"]["max_param_gap"] == 0.0
    assert "--dtype bf16" in steps["equivalence-opd-bf16"]["result"]["args"]
    assert steps["speedup"]["rc"] == -1 and "not a registered command" in steps["speedup"]["note"]
    assert json.loads((tmp_path / "out" / "gpu-smoke.json").read_text()) == doc


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
