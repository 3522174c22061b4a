"""The driver's typed seams and the defects a fresh machine showed (each test failed before)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from thundersync.bus.events import BarrierStats, LearnerReady, SourceKind, SourceReady, decode_event
from thundersync.bus.factory import BusKind, run_bus_kind
from thundersync.bus.inproc import InProcessBus
from thundersync.bus.protocol import BusError
from thundersync.cli import app
from thundersync.config import ConfigError, load_run_config, parse_set_overrides
from thundersync.driver.emit import OpdEmitter
from thundersync.driver.work_items import to_work_items
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn
from thundersync.rollout.trajectory import Trajectory, TrajectoryRef, Turn
from thundersync.rundir import RunDirWriter


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


def test_grpo_source_carries_its_group_index_as_a_field() -> None:
    base = dict(run_id="r", update=0, policy_version=0, group_id="g", reward=0.5)
    with pytest.raises(ValueError, match="needs index"):
        SourceReady(kind=SourceKind.GRPO_TRAJECTORY, source_id="s", traj_id="t", **base)
    ev = SourceReady(
        kind=SourceKind.GRPO_TRAJECTORY,
        source_id="s",
        traj_id="no-hash-here",  # the index is never parsed back out of the id
        index=3,
        token_ids=[5, 6, 7, 8],
        action_mask=[0, 0, 1, 1],
        prompt_len=2,
        **base,
    )
    reward, content = to_work_items(ev)  # the reward first: bound before H_i is computed
    assert content == GrpoContent("s", "g", 3, (7, 8), (1, 1))
    assert reward == GrpoReward("s/reward", "g", 3, 0.5)


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


def test_opd_turns_carry_only_their_segment_so_payload_is_linear_in_turns(tmp_path) -> None:
    bus = InProcessBus()
    sub = bus.subscribe("learner", "t", "t")
    files = RunDirWriter(tmp_path)
    em = OpdEmitter(bus=bus, run_id="r", update=0, policy_version=lambda: 0, plans={}, files=files)
    traj = _opd_trajectory(6)
    for turn in traj.turns:
        em.on_turn_completed(traj, turn)
    events = [d.event for d in sub.receive(timeout_s=1, max_count=100)]
    files.close()
    full = traj.prompt_ids + traj.response_ids
    assert sum(len(e.token_ids) for e in events) == len(full) - len(traj.turns[-1].obs_ids)
    for e, turn in zip(events, traj.turns, strict=True):
        assert e.token_ids == full[e.offset : e.offset + len(e.token_ids)]
        assert e.offset + len(e.token_ids) == turn.context_len + len(turn.action_ids)
        (item,) = to_work_items(e)
        assert isinstance(item, OpdTurn) and item.start == e.offset
        assert item.teacher_logprobs == tuple(turn.teacher_logprobs or ())


def test_learner_stats_travel_as_typed_events() -> None:
    stats = BarrierStats(
        run_id="r",
        update=2,
        rank=1,
        version=3,
        start=1.0,
        end=1.5,
        busy_s=0.25,
        reduce_s=0.1,
        step_s=0.2,
        publish_s=0.1,
        tokens=100,
        work_items=8,
        grad_norm=0.7,
        ready_to_recv_p99_ms=1.0,
        bus_p99_ms=0.5,
        peak_rss_mb=300.0,
        n_params=1000,
        max_staleness=0,
    )
    assert decode_event(stats.model_dump_json()) == stats
    assert stats.to_span_record()["role"] == "learner"  # rank 1 keeps its own lane
    ready = LearnerReady(run_id="r", rank=0, version=0)
    assert decode_event(ready.model_dump_json()) == ready


def test_trajectory_reference_names_a_trajectory_without_parsing() -> None:
    ref = TrajectoryRef("u1-g0-digits3", 2)
    assert str(ref) == "u1-g0-digits3#2"
    assert _opd_trajectory(1).ref == TrajectoryRef("u0-g0-x", 0)
