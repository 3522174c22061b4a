"""Objective sources, their ready times, and the release policies (schedules).

A *source* is one unit of gradient work whose inputs became fixed at a ready time: a GRPO
trajectory's content (tokens + mask), its reward, an OPD turn scored by the teacher, or the close
of an OPD trajectory (which triggers the deferred propagation of earlier-turn adjoints).

The schedules sync / group / stream differ ONLY in when a submitted source is released to the
learner's ready queue: at batch close, at the close of its group (OPD: its trajectory), or at once.
The gradient code path is the same for all three, which is what makes them comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from thundersync.config import Schedule


@dataclass(frozen=True)
class GrpoGroupSpec:
    group_id: str
    prompt_ids: tuple[int, ...]
    size: int


@dataclass(frozen=True)
class GrpoContent:
    """A trajectory's tokens and scored-token mask are fixed (its reward may come later)."""

    source_id: str
    group_id: str
    index: int
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...] | None = None  # the engine's, per scored token (metric)

    @property
    def key(self) -> str:
        return self.group_id


@dataclass(frozen=True)
class GrpoReward:
    source_id: str
    group_id: str
    index: int
    reward: float

    @property
    def key(self) -> str:
        return self.group_id


@dataclass(frozen=True)
class OpdTurn:
    """Turn `turn` (0-based) of an OPD trajectory: its segment tokens, action mask, teacher scores.

    Segment 0 starts with the prompt; segment j > 0 starts with the observation of turn j-1. The
    first token of a segment is never scored (it is predicted across the cut).
    `teacher_logprobs` has one entry per scored (mask == 1) token, in order. `start`, when given,
    is the segment's position in the trajectory (checked against the turns applied before it).
    """

    source_id: str
    traj_id: str
    turn: int
    token_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    teacher_logprobs: tuple[float, ...]
    start: int | None = None
    rollout_logprobs: tuple[float, ...] | None = None  # the engine's, per scored token (metric)

    @property
    def key(self) -> str:
        return self.traj_id


@dataclass(frozen=True)
class OpdClose:
    source_id: str
    traj_id: str
    num_turns: int

    @property
    def key(self) -> str:
        return self.traj_id


WorkItem = GrpoContent | GrpoReward | OpdTurn | OpdClose


@dataclass(frozen=True)
class Dropped:
    """A trajectory dropped after an infra failure (`rollout.on_failure: drop`), as a logged
    batch records it: GRPO member `index` of group `key`, or (index None) the OPD trajectory
    `key`. Not a work item: the engine applies it at once (`GradientEngine.drop`)."""

    source_id: str
    key: str
    index: int | None = None


@dataclass(order=True)
class _Queued:
    release: float
    seq: int
    item: WorkItem = field(compare=False)


class ReadyQueue:
    """Work-conserving ready queue: the earliest-released item the learner can admit goes first.

    An item is admissible when its group (OPD: trajectory) already holds statistics, or when fewer
    than `max_open` groups do (the per-rank admission cap on memory). OPD turns of a trajectory are
    applied in turn order, and a trajectory's close only after all its turns.
    """

    def __init__(self) -> None:
        self._items: list[_Queued] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: WorkItem, release: float) -> None:
        self._items.append(_Queued(release, self._seq, item))
        self._seq += 1

    def drop(self, key: str) -> None:
        self._items = [q for q in self._items if q.item.key != key]

    def queued_before(self, item: WorkItem) -> bool:
        """Whether another item of `item`'s group / trajectory was queued ahead of it."""
        mine = next(q for q in self._items if q.item is item)
        return any(q.item.key == item.key and q < mine for q in self._items)

    def pop(self, admissible: Callable[[WorkItem], bool]) -> WorkItem | None:
        best: _Queued | None = None
        for q in self._items:
            if admissible(q.item) and (best is None or q < best):
                best = q
        if best is None:
            return None
        self._items.remove(best)
        return best.item


@dataclass
class Releaser:
    """Holds submitted sources until the schedule releases them into the ready queue."""

    schedule: Schedule
    queue: ReadyQueue
    group_sizes: dict[str, int] = field(default_factory=dict)
    _held: dict[str, list[tuple[WorkItem, float]]] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)
    _batch_closed: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in (Schedule.SYNC, Schedule.GROUP, Schedule.STREAM):
            raise ValueError(
                f"schedule {self.schedule.value!r} is not lossless; the learner replays only "
                "sync, group or stream (async variants are built by the run driver)"
            )

    def expect_group(self, key: str, size: int) -> None:
        self.group_sizes[key] = size

    def submit(self, item: WorkItem, ready: float) -> None:
        if self.schedule is Schedule.STREAM:
            self.queue.push(item, ready)
            return
        self._held.setdefault(item.key, []).append((item, ready))
        if self.schedule is Schedule.GROUP and self._group_complete(item):
            self._release(self._held.pop(item.key), ready)

    def _group_complete(self, item: WorkItem) -> bool:
        key = item.key
        self._seen[key] = self._seen.get(key, 0) + 1
        if isinstance(item, OpdClose):
            return True
        if isinstance(item, GrpoContent | GrpoReward):
            return self._seen[key] == 2 * self.group_sizes[key]
        return False

    def drop(self, key: str) -> None:
        self._held.pop(key, None)
        self.group_sizes.pop(key, None)

    def resize(self, key: str, size: int) -> None:
        """A GRPO group lost a member: `group` releases it once the rest have arrived."""
        self.group_sizes[key] = size
        held = self._held.get(key)
        if self.schedule is Schedule.GROUP and held and self._seen.get(key, 0) == 2 * size:
            self._release(self._held.pop(key), max(r for _, r in held))

    def close_batch(self, now: float) -> None:
        self._batch_closed = True
        for key in list(self._held):
            self._release(self._held.pop(key), now)

    def _release(self, items: Iterable[tuple[WorkItem, float]], at: float) -> None:
        for item, _ in sorted(items, key=lambda x: x[1]):
            self.queue.push(item, at)
