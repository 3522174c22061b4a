"""The vLLM server's command line: a run's model dir, given relative to the run's cwd (`tsrl
train` writes runs/NAME/model), reaches the server as an absolute path, since the server runs in
its log dir and would take a relative one for a hub repo id."""

from __future__ import annotations

from pathlib import Path

import pytest

from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig


def test_a_relative_model_dir_is_made_absolute_and_a_name_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "r" / "model").mkdir(parents=True)
    cmd = VLLMServer(VLLMServerConfig(model="runs/r/model"), log_dir=tmp_path / "log").command()
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "runs" / "r" / "model")
    cmd = VLLMServer(VLLMServerConfig(model="org/name"), log_dir=tmp_path / "log").command()
    assert cmd[cmd.index("--model") + 1] == "org/name"  # not a local dir: as given
