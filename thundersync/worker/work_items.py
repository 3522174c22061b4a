"""Bus sources -> learner work items, and which learner rank owns a group.

The only place that reads a source event's payload (`bus.events`): a GRPO reward becomes a
`GrpoReward`, a GRPO trajectory's continuation a `GrpoContent`, an OPD turn (its new segment and
offset) an `OpdTurn`. Each source is one work item, applied in the order it arrives.
"""

from __future__ import annotations

import zlib

from thundersync.bus.events import (
    Event,
    GroupClosed,
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    OpdTurnReady,
    SourceReady,
    TrajectoryAborted,
    TrajectoryRegistered,
)
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn, WorkItem


def owner_rank(group_id: str, world: int) -> int:
    """Sources are placed on ranks by group (OPD: trajectory), by a hash stable across processes."""
    return zlib.crc32(group_id.encode()) % world


def owner_key(ev: Event) -> str | None:
    """The group (OPD: the trajectory) an event belongs to; None: an event for every rank."""
    match ev:
        case TrajectoryRegistered():
            return ev.traj_id
        case (
            GroupRegistered()
            | GrpoRewardReady()
            | GrpoTrajectoryReady()
            | OpdTurnReady()
            | GroupClosed()
            | TrajectoryAborted()
        ):
            return ev.group_id
    return None


def to_work_item(ev: SourceReady) -> WorkItem:
    match ev:
        case GrpoRewardReady():
            return GrpoReward(ev.source_id, ev.group_id, ev.index, float(ev.reward))
        case GrpoTrajectoryReady():
            return GrpoContent(
                ev.source_id,
                ev.group_id,
                ev.index,
                tuple(ev.token_ids),
                tuple(ev.action_mask),
                rollout_logprobs=_opt(ev.rollout_logprobs),
            )
        case OpdTurnReady():
            scored = [lp for lp, m in zip(ev.teacher_logprobs, ev.action_mask, strict=True) if m]
            return OpdTurn(
                ev.source_id,
                ev.traj_id,
                ev.turn,
                tuple(ev.token_ids),
                tuple(ev.action_mask),
                tuple(scored),
                start=ev.offset,
                rollout_logprobs=_opt(ev.rollout_logprobs),
            )


def _opt(xs: list[float] | None) -> tuple[float, ...] | None:
    return tuple(xs) if xs is not None else None
