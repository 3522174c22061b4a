"""The driver's typed seams and the defects a fresh machine showed (each test failed before)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from thundersync.bus.factory import BusKind, run_bus_kind
from thundersync.bus.protocol import BusError
from thundersync.cli import app
from thundersync.config import ConfigError, load_run_config, parse_set_overrides
from thundersync.rollout.trajectory import Trajectory, TrajectoryRef, Turn


def test_train_refuses_the_inproc_bus_at_once_with_the_fix() -> None:
    res = CliRunner().invoke(app, ["train", "grpo-toy", "--bus", "inproc", "--quiet"])
    assert res.exit_code == 2, res.output
    assert "--bus process" in res.output and "--bus redis" in res.output


def test_ray_placement_needs_the_broker_and_defaults_to_it() -> None:
    assert run_bus_kind(None, on_ray=False) is BusKind.PROCESS
    assert run_bus_kind(None, on_ray=True) is BusKind.REDIS
    with pytest.raises(BusError, match="use --bus redis"):
        run_bus_kind("process", on_ray=True)


def test_config_show_takes_a_plain_string_override() -> None:
    res = CliRunner().invoke(app, ["config", "show", "grpo-toy", "--set", "env.name=terminal"])
    assert res.exit_code == 0, res.output
    assert '"name": "terminal"' in res.output


def test_one_set_parser_for_every_command() -> None:
    got = parse_set_overrides(
        ["updates=3", "optim.lr=1e-3", "env.name=terminal", "model.path=null"]
    )
    assert got == {"updates": 3, "optim.lr": 1e-3, "env.name": "terminal", "model.path": None}
    with pytest.raises(ConfigError, match="key=value"):
        parse_set_overrides(["updates"])


def test_rloo_with_groups_of_one_is_refused_before_the_run_starts(tmp_path) -> None:
    from thundersync.driver.run import RunDriver

    cfg = load_run_config("grpo-toy", {"learner.estimator": "rloo"})
    cfg.rollout.group_size = 1  # a section assignment skips the cross-section rules
    with pytest.raises(ConfigError, match="rloo.*group_size >= 2"):
        RunDriver(cfg, tmp_path)
    assert not (tmp_path / "status.json").exists()  # nothing was started


def _opd_trajectory(turns: int) -> Trajectory:
    traj = Trajectory("u0-g0-x#0", "u0-g0-x", 0, prompt_ids=[1, 2, 3])
    ctx = len(traj.prompt_ids)
    for j in range(turns):
        action = [10 + j, 20 + j]
        turn = Turn(j, ctx, action, [0.0, 0.0], 0, "stop", teacher_logprobs=[-1.0 - j, -2.0])
        turn.obs_ids = [30 + j, 31, 32]
        traj.turns.append(turn)
        ctx += len(action) + len(turn.obs_ids)
    return traj


def test_trajectory_reference_names_a_trajectory_without_parsing() -> None:
    ref = TrajectoryRef("u1-g0-digits3", 2)
    assert str(ref) == "u1-g0-digits3#2"
    assert _opd_trajectory(1).ref == TrajectoryRef("u0-g0-x", 0)
