"""What a run is doing now (issue 36): long steps report a stage, the driver and the CLI listen.

Set-up code (the SmolLM2 download and conversion, model loading, the vLLM start) knows nothing of
a run directory or a terminal, so it calls `report`; the driver writes each stage to the run
directory (`RunDirWriter.write_stage`: DIR/stage.json and a `stage:` line in log.txt) and
`tsrl train` shows it as a rich status line. With no listener a report costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal

StageKind = Literal["model", "engine", "rollouts", "learner"]
STAGE_KINDS: tuple[StageKind, ...] = ("model", "engine", "rollouts", "learner")


@dataclass(frozen=True)
class Stage:
    """One stage: its kind, what it does, and where it stands (`step` of `total`, when known)."""

    kind: StageKind
    detail: str
    step: int | None = None
    total: int | None = None
    time: float = 0.0

    def line(self) -> str:
        """`converting SmolLM2-135M (3/4)`: the status line the service and the CLI show."""
        at = f" ({self.step}/{self.total})" if self.step is not None and self.total else ""
        return f"{self.detail}{at}"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


Listener = Callable[[Stage], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def report(kind: StageKind, detail: str, step: int | None = None, total: int | None = None) -> None:
    """Tell every listener (none outside a run) that the process entered a stage."""
    stage = Stage(kind, detail, step, total, round(time.time(), 3))
    with _lock:
        listeners = list(_listeners)
    for fn in listeners:
        fn(stage)


@contextmanager
def listening(fn: Listener) -> Iterator[None]:
    """Call `fn` with each stage reported while the block runs (any thread)."""
    with _lock:
        _listeners.append(fn)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(fn)
