"""Agent-loop callbacks -> bus events: each objective's sources, as soon as they are fixed.

GRPO: a trajectory is one source once its reward is known (tokens, mask, reward, group index).
OPD: each teacher-scored turn is one source (its new segment only), sent while the tool call of
that turn may still run; the trajectory's end closes its group. Called on the rollout event-loop
thread; publishing never waits for the learner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thundersync.bus.events import GroupClosed, SourceKind, SourceReady
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
        after_publish: Callable[[SourceReady, int], None] | None = None,
    ) -> None:
        self.bus, self.run_id, self.update = bus, run_id, update
        self.policy_version = policy_version
        self.plans, self.files = plans, files
        self.after_publish = after_publish
        self.tally = UpdateTally()

    def publish_source(self, **payload: Any) -> None:
        ev = SourceReady(
            run_id=self.run_id, update=self.update, policy_version=self.policy_version(), **payload
        )
        self.bus.publish(ev)
        self.tally.sources += 1
        self.tally.last_ready = max(self.tally.last_ready, ev.ready_at)
        if self.after_publish is not None:
            self.after_publish(ev, self.tally.sources)

    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        pass

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        self.tally.rewards.append(reward)

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        self.tally.tokens += len(traj.response_ids)
        self.files.write_spans(turn_spans(traj, self.update))


class GrpoEmitter(SourceEmitter):
    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        super().on_reward_ready(traj, reward)
        plan = self.plans[traj.trajectory_id]
        self.publish_source(
            kind=SourceKind.GRPO_TRAJECTORY,
            source_id=traj.trajectory_id,
            group_id=plan.group_id,
            traj_id=traj.trajectory_id,
            index=plan.ref.repetition,
            token_ids=traj.prompt_ids + traj.response_ids,
            action_mask=[0] * len(traj.prompt_ids) + traj.loss_mask,
            prompt_len=len(traj.prompt_ids),
            reward=reward,
            rollout_logprobs=[lp for t in traj.turns for lp in t.action_logprobs],
        )


class OpdEmitter(SourceEmitter):
    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        # the segment: what came after the previous action (prompt or observation), then this one
        lead = traj.prompt_ids if turn.index == 0 else traj.turns[turn.index - 1].obs_ids
        action = list(turn.action_ids)
        self.publish_source(
            kind=SourceKind.OPD_TURN,
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
