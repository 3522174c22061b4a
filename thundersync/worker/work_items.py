"""Bus payloads -> learner work items, and which learner rank owns a group.

The only place that reads a `SourceReady` payload's layout (`bus.events`): a GRPO trajectory
carries `[prompt; continuation]` and its group index, an OPD turn its new segment and offset.
"""

from __future__ import annotations

import zlib

from thundersync.bus.events import SourceKind, SourceReady
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn, WorkItem


def owner_rank(group_id: str, world: int) -> int:
    """Sources are placed on ranks by group (OPD: trajectory), by a hash stable across processes."""
    return zlib.crc32(group_id.encode()) % world


def to_work_items(ev: SourceReady) -> list[WorkItem]:
    if ev.kind is SourceKind.OPD_TURN:
        tlp = ev.teacher_logprobs or []
        scored = [lp for lp, m in zip(tlp, ev.action_mask, strict=True) if m]
        return [
            OpdTurn(
                ev.source_id,
                ev.traj_id,
                ev.turn,
                tuple(ev.token_ids),
                tuple(ev.action_mask),
                tuple(scored),
                start=ev.offset,
                rollout_logprobs=_opt(ev.rollout_logprobs),
            )
        ]
    p = ev.prompt_len
    index = ev.index
    assert index is not None and ev.reward is not None  # SourceReady validates grpo payloads
    # the reward first: bound before its content is applied, H_i goes straight into G1 and G2
    # (content first would hold a full-size copy of H_i until the reward's turn in the queue)
    return [
        GrpoReward(ev.source_id + "/reward", ev.group_id, index, float(ev.reward)),
        GrpoContent(
            ev.source_id,
            ev.group_id,
            index,
            tuple(ev.token_ids[p:]),
            tuple(ev.action_mask[p:]),
            rollout_logprobs=_opt(ev.rollout_logprobs),
        ),
    ]


def _opt(xs: list[float] | None) -> tuple[float, ...] | None:
    return tuple(xs) if xs is not None else None
