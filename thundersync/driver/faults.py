"""Fault injection for tests: a plan handed to `RunDriver(faults=...)`, never a config field.

The plan acts only on the driver's side of the run, at the points where a real fault would show:
a rollout worker dying mid-trajectory, a publisher retrying after a lost ack, the teacher server or
the learner process killed mid-update. The learner's own loop has no fault code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thundersync.bus.events import SourceReady
from thundersync.rollout.agent_loop import RolloutTask


@dataclass
class FaultPlan:
    crash_once: set[str] = field(default_factory=set)  # trajectory ids whose first attempt dies
    duplicate_sources: bool = False  # every source is published twice (a retried publish)
    kill_teacher_after: int | None = None  # SIGKILL the teacher server after N sources of update 1
    kill_learner_at_update: int | None = None  # SIGKILL the learner after its first source there
    kill_learner_at_publish: int | None = None  # SIGKILL it once it published this version,
    # before it could checkpoint it (the driver loaded the weights; its ack never arrives)

    def rollout_task(self, traj_id: str, task: RolloutTask, max_turns: int) -> RolloutTask:
        """The task to run for `traj_id`: its first attempt crashes when the plan says so."""
        if traj_id not in self.crash_once:
            return task
        self.crash_once.discard(traj_id)
        return _crashing(task, after_turns=min(1, max_turns - 1))

    def copies(self, ev: SourceReady) -> list[SourceReady]:
        """Extra publishes of a source (a publisher retrying after a lost ack)."""
        if not self.duplicate_sources:
            return []
        return [ev.model_copy(update={"event_id": ev.event_id + "-retry"})]

    def after_source(
        self,
        update: int,
        sources: int,
        *,
        kill_teacher: Callable[[], None],
        kill_learner: Callable[[], None],
    ) -> None:
        """Called after the `sources`-th source of `update` was published."""
        if update == 1 and sources == self.kill_teacher_after:
            kill_teacher()
        if update == self.kill_learner_at_update and sources == 1:
            kill_learner()

    def at_publish(self, version: int, *, kill_learner: Callable[[], None]) -> None:
        """Called when the driver loaded published version `version`, before acknowledging it."""
        if version == self.kill_learner_at_publish:
            kill_learner()


def _crashing(task: RolloutTask, after_turns: int) -> RolloutTask:
    """The trajectory's worker dies at its second tool call (after turn 0 was already sent to
    the learner), as a killed rollout worker would."""
    make = task.make_env

    def make_crashing() -> Any:
        env = make()
        real_step = env.step

        def step(action: str) -> Any:
            if env.turns >= after_turns:
                raise RuntimeError("injected rollout worker crash")
            return real_step(action)

        env.step = step
        return env

    return RolloutTask(task.instance_id, make_crashing, task.prompt, task.repetition, task.seed)
