"""Typed events that cross the bus between rollout workers, the driver and the learner.

Every event is a frozen pydantic model with a literal `type` tag, so one JSON line decodes back into
the right class (`decode_event`: a union discriminated by `type`) on any backend. Each event also
names a *natural dedup key* (`dedup_key()`): for a source it is the unique source id, for control
events the (run, update, group / replica / version) they describe. A publisher that retries after
a timeout may therefore publish the same fact twice; the consumer's applied-key ledger
(`bus.ledger`) makes sure it is applied once, which is what keeps a gradient from being counted
twice after a redelivery.

The learner's sources (`SourceReady`, the union of three types, each with exactly its fields): a
GRPO group opens with `GroupRegistered` (its size and its prompt); each trajectory then sends its
reward (`GrpoRewardReady`) and its content (`GrpoTrajectoryReady`: the continuation after the
prompt), both with `index`, its place in the group (the reduction order). An OPD trajectory opens
with `TrajectoryRegistered`; each turn (`OpdTurnReady`) carries only its new segment (the
observation of the previous turn, or the prompt for turn 0, then the turn's action) and `offset`,
the segment's position in the trajectory, so a trajectory's payload grows linearly with its turns.
`action_mask` (same length, 0/1) marks the scored tokens, and `teacher_logprobs` (same length)
holds log pi_T of each token (entries where the mask is 0 are ignored).
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator


class Role(StrEnum):
    ROLLOUT = "rollout"
    TOOL = "tool"
    TEACHER = "teacher"
    LEARNER = "learner"
    BARRIER = "barrier"


def _new_id() -> str:
    return uuid.uuid4().hex


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=_new_id, description="unique per publish call")
    emitted_at: float = Field(default_factory=time.time, description="unix seconds at creation")
    run_id: str

    def dedup_key(self) -> str:
        """Key under which the consumer's ledger records this event as applied."""
        return f"event:{self.event_id}"


class _Source(_Event):
    """What every learner source carries: a work item whose inputs are fixed."""

    source_id: str = Field(min_length=1, description="unique across the run")
    update: int = Field(ge=0)
    policy_version: int = Field(ge=0, description="version of theta that generated the tokens")
    group_id: str = Field(description="GRPO: the trajectory's group; OPD: the trajectory itself")
    traj_id: str
    ready_at: float = Field(default_factory=time.time, description="unix s the source became ready")

    def dedup_key(self) -> str:
        return f"source:{self.source_id}"


class _Tokens(_Source):
    """A token segment and the 0/1 flags of its scored tokens (one per token)."""

    token_ids: list[int]
    action_mask: list[int]
    rollout_logprobs: list[float] | None = Field(
        None, description="the engine's log-prob of each scored token (mask 1), for the mismatch"
    )

    @model_validator(mode="after")
    def _check_mask(self) -> Self:
        n = len(self.token_ids)
        if len(self.action_mask) != n:
            raise ValueError(
                f"action_mask has {len(self.action_mask)} entries but token_ids has {n}: "
                "give one 0/1 flag per token"
            )
        if any(v not in (0, 1) for v in self.action_mask):
            raise ValueError("action_mask must hold only 0 and 1")
        return self


class GrpoRewardReady(_Source):
    """A GRPO trajectory's reward (source id `TRAJ/reward`), sent just before its content."""

    type: Literal["grpo_reward_ready"] = "grpo_reward_ready"
    index: int = Field(ge=0, description="the trajectory's place in its group")
    reward: float


class GrpoTrajectoryReady(_Tokens):
    """A GRPO trajectory's content: its continuation after the group's prompt (source id `TRAJ`)."""

    type: Literal["grpo_trajectory_ready"] = "grpo_trajectory_ready"
    index: int = Field(ge=0, description="the trajectory's place in its group")


class OpdTurnReady(_Tokens):
    """One teacher-scored OPD turn: its new segment, where it starts, the teacher's log-probs."""

    type: Literal["opd_turn_ready"] = "opd_turn_ready"
    turn: int = Field(ge=0)
    offset: int = Field(ge=0, description="position of token_ids[0] in the trajectory")
    teacher_logprobs: list[float] = Field(description="log pi_T of each token (mask 0: ignored)")

    @model_validator(mode="after")
    def _check_teacher(self) -> Self:
        if len(self.teacher_logprobs) != len(self.token_ids):
            raise ValueError(
                f"teacher_logprobs has {len(self.teacher_logprobs)} entries, "
                f"token_ids {len(self.token_ids)}: give one per token"
            )
        return self


# the learner's sources; an `Event` decodes each by its `type` tag
SourceReady = GrpoRewardReady | GrpoTrajectoryReady | OpdTurnReady


class GroupRegistered(_Event):
    """A GRPO group opens: its size and its prompt, sent before its first source."""

    type: Literal["group_registered"] = "group_registered"
    update: int = Field(ge=0)
    group_id: str
    size: int = Field(ge=1, description="trajectories in the group (m)")
    prompt_ids: list[int] = Field(min_length=1, description="the prompt every member continues")

    def dedup_key(self) -> str:
        return f"group_registered:{self.run_id}:{self.update}:{self.group_id}"


class TrajectoryRegistered(_Event):
    """An OPD trajectory opens (its own group): the learner expects its turns, then its close."""

    type: Literal["trajectory_registered"] = "trajectory_registered"
    update: int = Field(ge=0)
    traj_id: str

    def dedup_key(self) -> str:
        return f"trajectory_registered:{self.run_id}:{self.update}:{self.traj_id}"


class GroupClosed(_Event):
    type: Literal["group_closed"] = "group_closed"
    update: int = Field(ge=0)
    group_id: str
    sources: int = Field(ge=0, description="source events sent for this group")

    def dedup_key(self) -> str:
        return f"group_closed:{self.run_id}:{self.update}:{self.group_id}"


class TrajectoryAborted(_Event):
    """A rollout failed: the learner drops what it holds for this trajectory (it is rerun), or,
    with `dropped` (`rollout.on_failure: drop`), drops the trajectory for good: a GRPO member
    (`index`) leaves its group, an OPD trajectory the update."""

    type: Literal["trajectory_aborted"] = "trajectory_aborted"
    update: int = Field(ge=0)
    traj_id: str
    group_id: str
    reason: str = ""
    dropped: bool = False
    index: int | None = Field(None, ge=0, description="GRPO drop: the member's place in its group")

    def dedup_key(self) -> str:
        return f"trajectory_aborted:{self.run_id}:{self.update}:{self.traj_id}"


class BatchClosed(_Event):
    type: Literal["batch_closed"] = "batch_closed"
    update: int = Field(ge=0)
    groups: int = Field(ge=0)
    sources: int = Field(ge=0)

    def dedup_key(self) -> str:
        return f"batch_closed:{self.run_id}:{self.update}"


class PolicyPublished(_Event):
    type: Literal["policy_published"] = "policy_published"
    version: int = Field(ge=0)
    uri: str = Field("", description="where replicas load the weights from")

    def dedup_key(self) -> str:
        return f"policy_published:{self.run_id}:{self.version}"


class ReplicaAcked(_Event):
    type: Literal["replica_acked"] = "replica_acked"
    replica_id: str
    version: int = Field(ge=0)

    def dedup_key(self) -> str:
        return f"replica_acked:{self.run_id}:{self.replica_id}:{self.version}"


class Span(_Event):
    """A timeline span (same fields as a line of DIR/spans.jsonl)."""

    type: Literal["span"] = "span"
    update: int = Field(ge=0)
    role: Role
    kind: str
    ids: dict[str, str] = Field(default_factory=dict)
    start: float
    end: float
    ready: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.end < self.start:
            raise ValueError(f"span ends ({self.end}) before it starts ({self.start})")
        return self

    def to_jsonl_record(self) -> dict[str, Any]:
        """The DIR/spans.jsonl line of docs/CONTRACTS.md."""
        rec: dict[str, Any] = {
            "type": "span",
            "update": self.update,
            "role": str(self.role),
            "kind": self.kind,
            "ids": dict(self.ids),
            "start": self.start,
            "end": self.end,
        }
        if self.ready is not None:
            rec["ready"] = self.ready
        return rec


class LearnerReady(_Event):
    """A learner rank loaded theta_k and listens: the driver opens the first update after all."""

    type: Literal["learner_ready"] = "learner_ready"
    rank: int = Field(ge=0)
    version: int = Field(ge=0)

    def dedup_key(self) -> str:
        return f"learner_ready:{self.run_id}:{self.rank}:{self.version}"


class BarrierStats(_Event):
    """What one learner rank measured in update k, sent once its optimizer step is done.

    `busy_s` is L (time in work items), `start`/`end` bound the barrier (reduce + step + publish:
    P). Latencies are p99 over the update: `ready_to_recv` from a source's ready time to the learner
    receiving it, `bus` only for sources that arrived while the learner waited.
    """

    type: Literal["barrier_stats"] = "barrier_stats"
    update: int = Field(ge=0)
    rank: int = Field(0, ge=0)
    version: int = Field(ge=0, description="the version this step produced (k + 1)")
    start: float
    end: float
    busy_s: float = Field(ge=0)
    reduce_s: float = Field(ge=0)
    step_s: float = Field(ge=0)
    publish_s: float = Field(ge=0)
    tokens: int = Field(ge=0, description="tokens forwarded by this rank")
    work_items: int = Field(ge=0)
    grad_norm: float
    ready_to_recv_p99_ms: float = Field(ge=0)
    bus_p99_ms: float = Field(ge=0)
    peak_rss_mb: float = Field(ge=0)
    n_params: int = Field(ge=0)
    max_staleness: int = Field(ge=0)
    logprob_mismatch_mean: float = Field(0.0, ge=0, description="|rollout - learner| log-prob")
    logprob_mismatch_max: float = Field(0.0, ge=0)
    logprob_tokens: int = Field(0, ge=0, description="tokens the mismatch is measured on")
    # OPD, over every rank's closed trajectories (the learner sums them across ranks)
    kl_mean: float = Field(0.0, description="mean sampled reverse KL to the teacher per token")
    distill_loss: float = Field(0.0, description="the surrogate loss -sum A log pi / N_k")
    scored_tokens: int = Field(0, ge=0, description="N_k: the update's scored tokens")

    def dedup_key(self) -> str:
        return f"barrier_stats:{self.run_id}:{self.update}:{self.rank}"

    def to_span_record(self) -> dict[str, Any]:
        """The barrier's line in DIR/spans.jsonl (rank 0 on the barrier lane, others' on theirs)."""
        ids = {"rank": str(self.rank)} if self.rank else {}
        role = Role.BARRIER if self.rank == 0 else Role.LEARNER
        return Span(
            run_id=self.run_id,
            update=self.update,
            role=role,
            kind="barrier",
            ids=ids,
            start=self.start,
            end=self.end,
        ).to_jsonl_record()


Event = Annotated[
    GrpoRewardReady
    | GrpoTrajectoryReady
    | OpdTurnReady
    | GroupRegistered
    | TrajectoryRegistered
    | GroupClosed
    | BatchClosed
    | TrajectoryAborted
    | PolicyPublished
    | ReplicaAcked
    | LearnerReady
    | BarrierStats
    | Span,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def encode_event(event: Event) -> str:
    return event.model_dump_json()


def decode_event(data: str | bytes) -> Event:
    """Parse one encoded event; raises pydantic.ValidationError naming the bad field."""
    return _ADAPTER.validate_json(data)
