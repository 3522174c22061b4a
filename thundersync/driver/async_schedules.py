"""The stale comparison schedules, `async` and `fully_async`: not lossless, run to be compared.

async: rollouts of update u run on theta_{u-1} while the learner steps u-1 (one step stale); the
new policy is loaded between updates. fully_async: every published policy is loaded the moment it
lands, even mid-trajectory. An update's metrics come with its step, which may finish while later
rollouts already run, so they are written when its barrier stats arrive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from thundersync.bus.events import BarrierStats, PolicyPublished
from thundersync.bus.protocol import Subscription
from thundersync.driver.emit import UpdateTally
from thundersync.driver.metrics import Timeline, UpdateTimes
from thundersync.rollout.inference_engine import InferenceEngine

# writes one update's metrics line: (update, times, tally, the learner's stats, version)
MetricsWriter = Callable[[int, UpdateTimes, UpdateTally, BarrierStats | None, int], None]


class AsyncSchedule:
    """The driver's side of `async` / `fully_async`: the policy listener, the wait for
    theta_{u-1}, the metrics deferred until their step is done."""

    def __init__(
        self,
        ctrl: Subscription,
        engine: InferenceEngine,
        *,
        fully: bool,
        check_alive: Callable[[str], None],
    ) -> None:
        self.ctrl, self.engine, self.fully = ctrl, engine, fully
        self.check_alive = check_alive
        self.published: dict[int, str] = {}
        self.pending: dict[int, tuple[float, float, UpdateTally]] = {}
        self._stop = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="policy-listener", daemon=True)
        self._listener.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            for d in self.ctrl.receive(timeout_s=0.2):
                self.ctrl.ack(d)
                e = d.event
                if isinstance(e, PolicyPublished):
                    self.published[e.version] = e.uri
                    if self.fully and e.version > self.engine.version:
                        self.engine.load_weights(e.version, e.uri)

    def before_update(self, update: int, timeout_s: float = 600.0) -> None:
        """async: update u's rollouts wait for theta_{u-1} (fully_async never waits)."""
        version = update - 1
        if self.fully or version < 1:
            return
        deadline = time.time() + timeout_s
        while version not in self.published and self.engine.version < version:
            self.check_alive(f"waiting for policy v{version}")
            if time.time() > deadline:
                raise TimeoutError(f"policy v{version} was not published within {timeout_s:.0f}s")
            time.sleep(0.01)
        if self.engine.version < version:
            self.engine.load_weights(version, self.published[version])

    def defer(self, update: int, start: float, rollout_end: float, tally: UpdateTally) -> None:
        self.pending[update] = (start, rollout_end, tally)

    def flush(self, timeline: Timeline, write: MetricsWriter, *, block: bool) -> None:
        """Write the metrics of every deferred update whose step is done (block: wait for all)."""
        for k in sorted(self.pending):
            stats = timeline.barrier(k, timeout_s=600.0 if block else 0.0)
            if stats is None:
                return
            start, r_end, tally = self.pending.pop(k)
            write(k, UpdateTimes(start, r_end, stats.end), tally, stats, stats.version)

    def close(self) -> None:
        self._stop.set()
        self._listener.join(timeout=2)
