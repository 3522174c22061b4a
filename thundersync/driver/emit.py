"""Agent-loop callbacks -> bus events: each objective's sources, as soon as they are fixed.

GRPO: a trajectory is one source once its reward is known, sent as two events, its reward
(`GrpoRewardReady`) then its content (`GrpoTrajectoryReady`: the continuation only); the first of
a group is preceded by the group's registration, which carries the prompt. OPD: each
teacher-scored turn is one source (`OpdTurnReady`: its new segment only), sent while the tool call
of that turn may still run; the trajectory's end closes its group. Called on the rollout
event-loop thread; publishing never waits for the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thundersync.bus.events import (
    GroupClosed,
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    OpdTurnReady,
    SourceReady,
)
from thundersync.bus.protocol import Bus
from thundersync.config import Objective
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.rollout.trajectory import Trajectory, Turn
from thundersync.rundir import RunDirWriter


@dataclass
class UpdateTally:
    """What the driver counts of one update's rollouts (for its metrics line)."""

    sources: int = 0
    last_ready: float = 0.0
    tokens: int = 0
    rewards: list[float] = field(default_factory=list)
    drops: dict[str, Any] = field(default_factory=dict)  # driver.failures.DropBook.metrics()
    # named scores (a terminal verifier's reward.json) of the trajectories that reported them
    scores: dict[str, list[float]] = field(default_factory=dict)

    @property
    def reward_mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


class SourceEmitter:
    """Shared part of both objectives: publishing, counting, the rollout spans."""

    def __init__(
        self,
        *,
        bus: Bus,
        run_id: str,
        update: int,
        policy_version: Callable[[], int],
        plans: dict[str, PlannedTrajectory],
        files: RunDirWriter,
        group_size: int = 1,
        after_publish: Callable[[list[SourceReady], int], None] | None = None,
    ) -> None:
        self.bus, self.run_id, self.update = bus, run_id, update
        self.policy_version = policy_version
        self.plans, self.files = plans, files
        self.group_size = group_size
        self.registered: set[str] = set()  # GRPO groups whose registration (with prompt) is out
        self.after_publish = after_publish
        self.tally = UpdateTally()
        # rollout.on_failure: drop (driver.failures): GRPO groups that lost members before they
        # registered (their size then), groups dropped whole (nothing more is sent for them),
        # and the trajectories whose every event went out (a failure after that drops nothing)
        self.group_sizes: dict[str, int] = {}
        self.skipped: set[str] = set()
        self.sent: set[str] = set()

    def publish_source(self, *events: SourceReady) -> None:
        """Publish one source (its events, in order) and count it."""
        for ev in events:
            self.bus.publish(ev)
        self.tally.sources += 1
        self.tally.last_ready = max(self.tally.last_ready, *(ev.ready_at for ev in events))
        if self.after_publish is not None:
            self.after_publish(list(events), self.tally.sources)

    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        pass

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        self.tally.rewards.append(reward)
        for name, value in (traj.metadata.get("scores") or {}).items():
            self.tally.scores.setdefault(str(name), []).append(float(value))

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        self.tally.tokens += len(traj.response_ids)
        self.files.write_spans(turn_spans(traj, self.update))


class GrpoEmitter(SourceEmitter):
    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        plan = self.plans[traj.trajectory_id]
        gid, tid, index = plan.group_id, traj.trajectory_id, plan.ref.repetition
        if gid in self.skipped:
            return
        super().on_reward_ready(traj, reward)
        if gid not in self.registered:  # every member shares the prompt: the first one sends it
            self.registered.add(gid)
            self.bus.publish(
                GroupRegistered(
                    run_id=self.run_id,
                    update=self.update,
                    group_id=gid,
                    size=self.group_sizes.get(gid, self.group_size),
                    prompt_ids=list(traj.prompt_ids),
                )
            )
        run, k, v, now = self.run_id, self.update, self.policy_version(), time.time()
        # the reward first: bound before its content is applied, H_i goes straight into G1 and G2
        # (content first would hold a full-size copy of H_i until the reward's turn in the queue)
        self.publish_source(
            GrpoRewardReady(
                run_id=run,
                update=k,
                policy_version=v,
                ready_at=now,
                source_id=f"{tid}/reward",
                group_id=gid,
                traj_id=tid,
                index=index,
                reward=reward,
            ),
            GrpoTrajectoryReady(
                run_id=run,
                update=k,
                policy_version=v,
                ready_at=now,
                source_id=tid,
                group_id=gid,
                traj_id=tid,
                index=index,
                token_ids=list(traj.response_ids),
                action_mask=list(traj.loss_mask),
                rollout_logprobs=[lp for t in traj.turns for lp in t.action_logprobs],
            ),
        )
        self.sent.add(tid)


class OpdEmitter(SourceEmitter):
    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        # the segment: what came after the previous action (prompt or observation), then this one
        lead = traj.prompt_ids if turn.index == 0 else traj.turns[turn.index - 1].obs_ids
        action = list(turn.action_ids)
        self.publish_source(
            OpdTurnReady(
                run_id=self.run_id,
                update=self.update,
                policy_version=self.policy_version(),
                source_id=f"{traj.trajectory_id}/turn{turn.index}",
                group_id=traj.trajectory_id,
                traj_id=traj.trajectory_id,
                turn=turn.index,
                offset=turn.context_len - len(lead),
                token_ids=list(lead) + action,
                action_mask=[0] * len(lead) + [1] * len(action),
                teacher_logprobs=[0.0] * len(lead) + list(turn.teacher_logprobs or []),
                rollout_logprobs=list(turn.action_logprobs),
            )
        )

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        super().on_trajectory_completed(traj)
        self.bus.publish(
            GroupClosed(
                run_id=self.run_id,
                update=self.update,
                group_id=traj.trajectory_id,
                sources=len(traj.turns),
            )
        )
        self.sent.add(traj.trajectory_id)


EMITTERS: dict[Objective, type[SourceEmitter]] = {
    Objective.GRPO: GrpoEmitter,
    Objective.OPD: OpdEmitter,
}


def turn_spans(traj: Trajectory, update: int) -> list[dict[str, Any]]:
    """The rollout, tool and teacher spans of a finished trajectory (DIR/spans.jsonl lines)."""
    out = []
    for t in traj.turns:
        ids = {"traj": traj.trajectory_id, "turn": str(t.index)}
        lanes = [
            ("rollout", "generate", t.gen_start, t.gen_end),
            ("tool", "tool_call", t.tool_start, t.tool_end),
            ("teacher", "score", t.teacher_start, t.teacher_end),
        ]
        for role, kind, start, end in lanes:
            if start is not None and end is not None:
                rec = {"type": "span", "update": update, "role": role, "kind": kind}
                out.append(rec | {"ids": ids, "start": start, "end": end})
    return out
