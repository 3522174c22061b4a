"""`tsrl replay-gap`: a run recorded with `record_batches` is checked against sync from theta_0.

The check must pass on a real streamed run, fail on weights that are not what sync gives, and
refuse a run that recorded nothing with the fix in the message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.config import load_run_config
from thundersync.driver.run import RunDriver
from thundersync.rundir import RunFiles


def _last_json(text: str) -> dict[str, Any]:
    (line,) = [x for x in text.splitlines() if x.startswith("{")]
    out: dict[str, Any] = json.loads(line)
    return out


def _run(run_dir: Path, **over: object) -> None:
    cfg = load_run_config("grpo-toy", {"updates": 2, **over})
    assert RunDriver(cfg, run_dir).run() == 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("recorded")
    _run(d, record_batches=True)  # the config field alone turns recording on
    return d


def test_a_recorded_stream_run_replays_to_the_same_parameters(recorded: Path) -> None:
    res = CliRunner().invoke(app, ["replay-gap", str(recorded), "--json"])
    assert res.exit_code == 0, res.output
    out = _last_json(res.stdout)
    assert out["schedule"] == "stream" and len(out["gaps"]) == 2
    assert out["max_param_gap"] == 0.0 and out["equal_to_sync"] is True


def test_weights_that_differ_from_sync_fail_the_check(recorded: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "tampered"
    shutil.copytree(recorded, d)
    f = RunFiles(d).weights(2) / "model.safetensors"
    state = load_file(str(f))
    name = next(iter(state))
    state[name] = state[name] + 1e-3
    save_file(state, str(f))
    res = CliRunner().invoke(app, ["replay-gap", str(d), "--json"])
    assert res.exit_code == 1, res.output
    out = _last_json(res.stdout)
    assert out["gaps"][0] == 0.0 and out["gaps"][1] > 0.0 and out["equal_to_sync"] is False


def test_a_run_without_recorded_batches_is_refused_with_the_fix(tmp_path: Path) -> None:
    _run(tmp_path)
    res = CliRunner().invoke(app, ["replay-gap", str(tmp_path)])
    assert res.exit_code == 2
    assert "record_batches=true" in res.output and "batches" in res.output


def _legacy_lines(path: Path) -> list[str]:
    """A batch log as runs wrote it before the typed sources: one untagged `source_ready` per
    GRPO trajectory, its prompt and reward fused into it."""
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    prompts = {e["group_id"]: e["prompt_ids"] for e in events if e["type"] == "group_registered"}
    rewards = {e["traj_id"]: e["reward"] for e in events if e["type"] == "grpo_reward_ready"}
    out = []
    for e in events:
        if e["type"] != "grpo_trajectory_ready":
            continue
        prompt = prompts[e["group_id"]]
        e |= {
            "type": "source_ready",
            "kind": "grpo_trajectory",
            "token_ids": prompt + e["token_ids"],
            "action_mask": [0] * len(prompt) + e["action_mask"],
            "prompt_len": len(prompt),
            "reward": rewards[e["traj_id"]],
        }
        out.append(json.dumps(e))
    return out


def test_a_batch_log_recorded_before_the_typed_sources_still_replays(
    recorded: Path, tmp_path: Path
) -> None:
    import shutil

    d = tmp_path / "legacy"
    shutil.copytree(recorded, d)
    for paths in RunFiles(d).batch_logs().values():
        for p in paths:
            p.write_text("".join(x + "\n" for x in _legacy_lines(p)))
            assert '"source_ready"' in p.read_text()
    res = CliRunner().invoke(app, ["replay-gap", str(d), "--json"])
    assert res.exit_code == 0, res.output
    assert _last_json(res.stdout)["max_param_gap"] == 0.0
