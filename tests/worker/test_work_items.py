"""The learner worker's inputs: how it reads a source event into work items, and its stats event
(each test failed before the fix it pins)."""

from __future__ import annotations

from thundersync.bus.events import (
    BarrierStats,
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    LearnerReady,
    decode_event,
)
from thundersync.bus.inproc import InProcessBus
from thundersync.driver.emit import GrpoEmitter, OpdEmitter
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn
from thundersync.rollout.agent_loop import RolloutTask
from thundersync.rollout.trajectory import Trajectory, Turn
from thundersync.rundir import RunDirWriter
from thundersync.worker.work_items import to_work_item


def _grpo_trajectory(rep: int) -> Trajectory:
    traj = Trajectory(f"u0-g0-x#{rep}", "u0-g0-x", rep, prompt_ids=[1, 2, 3])
    turn = Turn(0, 3, [10 + rep, 11], [-0.5, -0.25], 0, "stop")
    turn.obs_ids = [30, 31]
    traj.turns.append(turn)
    return traj


def test_grpo_group_registers_with_its_prompt_then_each_reward_before_its_content(
    tmp_path,
) -> None:
    """The prompt travels once, with the group; a trajectory's sources hold only its
    continuation, and its index is a field (never parsed back out of an id)."""
    bus = InProcessBus()
    sub = bus.subscribe("learner", "t", "t")
    files = RunDirWriter(tmp_path)
    plans = {
        f"u0-g0-x#{j}": PlannedTrajectory(RolloutTask("u0-g0-x", list, [], repetition=j), "grp")
        for j in range(2)
    }
    em = GrpoEmitter(
        bus=bus,
        run_id="r",
        update=0,
        policy_version=lambda: 0,
        plans=plans,
        files=files,
        group_size=2,
    )
    for j, reward in ((1, 0.5), (0, -1.0)):
        em.on_reward_ready(_grpo_trajectory(j), reward)
    events = [d.event for d in sub.receive(timeout_s=1, max_count=100)]
    files.close()
    reg, *sources = events
    assert reg == GroupRegistered(
        run_id="r",
        update=0,
        group_id="grp",
        size=2,
        prompt_ids=[1, 2, 3],
        event_id=reg.event_id,
        emitted_at=reg.emitted_at,
    )
    assert [type(e) for e in sources] == [GrpoRewardReady, GrpoTrajectoryReady] * 2
    assert em.tally.sources == 2  # a trajectory is one source, sent as two events
    items = [to_work_item(e) for e in sources]
    assert items[0] == GrpoReward("u0-g0-x#1/reward", "grp", 1, 0.5)
    assert items[1] == GrpoContent(
        "u0-g0-x#1", "grp", 1, (11, 11, 30, 31), (1, 1, 0, 0), rollout_logprobs=(-0.5, -0.25)
    )
    assert items[2] == GrpoReward("u0-g0-x#0/reward", "grp", 0, -1.0)


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
        item = to_work_item(e)
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
