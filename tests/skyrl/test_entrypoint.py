"""The switch: a SkyRL config run from SkyRL's own entry point with
`trainer.override_entrypoint=thundersync.skyrl.entrypoint` trains with ThunderSync's streaming
learner on a SkyRL dataset of shipped terminal tasks; what has no exact form is refused by field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from skyrl.train.config import SkyRLTrainConfig

from thundersync.config import ConfigError, load_run_config
from thundersync.hf_models import build_tiny_model, load_tokenizer
from thundersync.rundir import RunFiles, RunStatus
from thundersync.sandbox.envs.fixtures import builtin_task_dir, terminal_tasks
from thundersync.skyrl.dataset import DatasetError, dataset_tasks
from thundersync.skyrl.switch import SkyRLConfigError
from thundersync.skyrl.translate import run_config_from_skyrl


def _dataset(path: Path, env_class: str = "tsrl-terminal") -> Path:
    dirs = terminal_tasks(builtin_task_dir("terminal-easy"))
    lines = [json.dumps({"env_class": env_class, "task": str(d)}) for d in dirs]
    path.write_text("\n".join(lines) + "\n")
    return path


def _overrides(model: Path, data: Path, **extra: object) -> list[str]:
    base = {
        "trainer.policy.model.path": str(model),
        "data.train_data": f"['{data}']",
        "trainer.train_batch_size": 2,
        "trainer.policy_mini_batch_size": 2,
        "generator.n_samples_per_prompt": 2,
        "generator.sampling_params.max_generate_length": 16,
        "trainer.algorithm.use_kl_loss": "false",
        "trainer.algorithm.loss_reduction": "sequence_mean",
        "trainer.run_name": "skyrl-switch",
        "trainer.logger": "console",
    } | extra
    return [f"{k}={v}" for k, v in base.items()]


def _switch(tmp_path: Path, model: Path, data: Path, **extra: object) -> tuple[Any, RunFiles]:
    """SkyRL's entry point with the switch, in `tmp_path`: (its last JSON line, the run dir)."""
    args = ["trainer.override_entrypoint=thundersync.skyrl.entrypoint"]
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.skyrl.entrypoint", *args]
        + _overrides(model, data, **extra),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "runs" / str(extra.get("trainer.run_name", "skyrl-switch"))
    return json.loads(out.stdout.strip().splitlines()[-1]), RunFiles(run_dir)


def test_skyrl_entry_point_with_the_switch_trains_on_shipped_terminal_tasks(
    tmp_path: Path,
) -> None:
    model = build_tiny_model(tmp_path / "model", seed=0)
    data = _dataset(tmp_path / "train.jsonl")  # 5 rows: 2 steps of 2 prompts
    last, run = _switch(tmp_path, model, data)
    assert last["updates"] == 2
    cfg = json.loads(run.config.read_text())
    assert cfg["env"] == cfg["env"] | {"name": "skyrl-dataset", "tasks": str(data)}
    assert cfg["learner"]["estimator"] == "grpo_sample_std"  # SkyRL's grpo
    assert cfg["rollout"] | {"group_size": 2, "groups_per_update": 2} == cfg["rollout"]
    updates = [r for r in run.read_metrics() if r.get("type") == "update"]
    assert [u["update"] for u in updates] == [0, 1]
    assert all(u["sources"] == 4 and u["max_staleness"] == 0 for u in updates)
    assert all("score/reward" in u for u in updates)  # rewards from the tasks' verifiers
    status = run.read_status()
    assert status is not None and status[0] is RunStatus.SUCCEEDED


def test_skyrl_distillation_recipe_through_the_switch_trains_with_its_ref_model_as_teacher(
    tmp_path: Path,
) -> None:
    model = build_tiny_model(tmp_path / "model", seed=0)
    teacher = build_tiny_model(tmp_path / "teacher", seed=1, tokenizer=load_tokenizer(model))
    opd = {
        "trainer.algorithm.advantage_estimator": "thundersync_opd",
        "trainer.algorithm.policy_loss_type": "importance_sampling",
        "trainer.algorithm.loss_reduction": "token_mean",
        "trainer.ref.model.path": str(teacher),
        "trainer.max_training_steps": 1,
        "trainer.run_name": "skyrl-opd",
    }
    _, run = _switch(tmp_path, model, _dataset(tmp_path / "train.jsonl"), **opd)
    cfg = json.loads(run.config.read_text())
    assert cfg["objective"] == "opd" and cfg["teacher"]["model"] == str(teacher)
    (update,) = [r for r in run.read_metrics() if r.get("type") == "update"]
    assert update["scored_tokens"] > 0 and update["kl_mean"] != 0.0  # the teacher scored turns


def _translate(tmp_path: Path, **extra: object) -> object:
    data = _dataset(tmp_path / "train.jsonl")
    cfg = SkyRLTrainConfig.from_cli_overrides(_overrides(tmp_path / "m", data, **extra))
    return run_config_from_skyrl(cfg)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"trainer.policy_mini_batch_size": 1}, "trainer.policy_mini_batch_size"),
        ({"trainer.update_epochs_per_batch": 2}, "trainer.update_epochs_per_batch"),
        ({"trainer.train_batch_size": 9, "trainer.policy_mini_batch_size": 9}, "train_batch_size"),
        ({"trainer.algorithm.use_kl_loss": "true"}, "trainer.algorithm.use_kl_loss"),
        ({"trainer.policy.optimizer_config.num_warmup_steps": 3}, "optimizer_config.scheduler"),
        ({"data.train_data": "['a.jsonl','b.jsonl']"}, "data.train_data"),
    ],
)
def test_skyrl_settings_without_an_exact_form_are_refused_by_field(
    tmp_path: Path, extra: dict[str, object], field: str
) -> None:
    with pytest.raises(SkyRLConfigError, match=field.replace(".", r"\.")):
        _translate(tmp_path, **extra)


def test_steps_follow_skyrl_epochs_and_max_training_steps(tmp_path: Path) -> None:
    assert _translate(tmp_path, **{"trainer.epochs": 3}).updates == 6  # type: ignore[attr-defined]
    capped = _translate(tmp_path, **{"trainer.epochs": 3, "trainer.max_training_steps": 4})
    assert capped.updates == 4  # type: ignore[attr-defined]


def test_dataset_rows_are_checked_by_file_row_and_column(tmp_path: Path) -> None:
    bad = _dataset(tmp_path / "bad.jsonl", env_class="gsm8k-typo")
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 0: env_class 'gsm8k-typo'"):
        dataset_tasks(bad, {})
    refs = dataset_tasks(_dataset(tmp_path / "ok.jsonl"), {"backend": "local"})
    assert [r.env_id for r in refs] == ["tsrl-terminal"] * 5
    assert refs[0].extras["backend"] == "local" and Path(refs[0].extras["task"]).is_dir()


def test_skyrl_dataset_env_needs_a_dataset_file() -> None:
    with pytest.raises(ConfigError, match="env.name=skyrl-dataset reads a SkyRL dataset file"):
        load_run_config(data={"env": {"name": "skyrl-dataset"}})
    with pytest.raises(DatasetError, match=r"a SkyRL dataset is a \.parquet, \.json, \.jsonl file"):
        dataset_tasks("some/dir", {})


def test_confined_rows_stay_in_the_dataset_folder(tmp_path: Path) -> None:
    """Service runs (`env.dataset_confined`): relative task paths from the dataset's folder only;
    a row may not set the executor; the run's sandbox settings win over a row's."""
    (tmp_path / "tasks" / "t1").mkdir(parents=True)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(
        json.dumps({"env_class": "tsrl-terminal", "task": "tasks/t1", "backend": "local"})
    )
    (ref,) = dataset_tasks(ok, {"backend": "docker"}, confined=True)
    assert ref.extras["task"] == str(tmp_path / "tasks" / "t1")
    assert ref.extras["backend"] == "docker"
    for i, bad in enumerate(("../outside", "/etc", "tasks/../../x")):
        f = tmp_path / f"bad{i}.jsonl"
        f.write_text(json.dumps({"env_class": "tsrl-terminal", "task": bad}))
        with pytest.raises(DatasetError, match=r"row 0: task .* leaves the task set"):
            dataset_tasks(f, {}, confined=True)
    f = tmp_path / "exec.jsonl"
    f.write_text(json.dumps({"env_class": "tsrl-terminal", "executor": "local"}))
    with pytest.raises(DatasetError, match="column 'executor' is ThunderSync's to set"):
        dataset_tasks(f, {})


def test_skyrl_distillation_recipe_becomes_an_opd_run_with_the_ref_model_as_teacher(
    tmp_path: Path,
) -> None:
    opd = {
        "trainer.algorithm.advantage_estimator": "thundersync_opd",
        "trainer.algorithm.policy_loss_type": "importance_sampling",
        "trainer.algorithm.loss_reduction": "token_mean",
    }
    # SkyRL's ref model defaults to the policy: so does the teacher
    assert _translate(tmp_path, **opd).teacher.model == str(tmp_path / "m")  # type: ignore[attr-defined]
    cfg = _translate(tmp_path, **opd, **{"trainer.ref.model.path": str(tmp_path / "teacher")})
    assert cfg.objective.value == "opd"  # type: ignore[attr-defined]
    assert cfg.teacher.model == str(tmp_path / "teacher")  # type: ignore[attr-defined]
