"""The learner process: applies every ready source the moment it arrives, steps at the barrier.

It runs in its own process (own interpreter, own core) so that its backward passes truly overlap
with rollout. Its loop is the data flow of DESIGN.md, from the learner's side:
    source ready -> backward at once (the schedule decides when a source is released)
    batch closed -> drain -> barrier: reduce, normalise, clip, one AdamW step
                 -> save theta_{k+1}, publish it, wait for every replica's ack -> next update
Events of a later update (async schedules) wait in a buffer until that update opens. Each source
is applied once (ledger by source id), so a redelivered or duplicated event never counts twice.
"""

from __future__ import annotations

import os
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bus.events import (
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    PolicyPublished,
    ReplicaAcked,
    Role,
    SourceKind,
    SourceReady,
    Span,
    TrajectoryAborted,
)
from bus.ledger import ExactlyOnce, MemoryLedger
from learner.engine import GradientEngine
from learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward, OpdClose, OpdTurn, WorkItem
from tsrl.config import LOSSLESS_SCHEDULES, Objective, RunConfig, Schedule


@dataclass
class LearnerSpec:
    """Everything the learner process needs (picklable: it crosses the spawn boundary)."""

    cfg_json: str
    model_dir: str
    run_dir: str
    run_id: str
    replicas: tuple[str, ...] = ("engine-0",)
    cpu: int | None = None
    threads: int = 1
    resume: bool = False
    log_batches: bool = False
    ack_timeout_s: float = 120.0
    rank: int = 0
    world: int = 1
    port: int = 0  # gloo rendezvous when world > 1


def owner_rank(group_id: str, world: int) -> int:
    """Sources are placed on ranks by group (OPD: trajectory), by a hash stable across processes."""
    return zlib.crc32(group_id.encode()) % world


@dataclass(frozen=True)
class BusRef:
    """How a spawned process reaches a broker-backed bus (a client cannot be pickled)."""

    kind: str
    prefix: str
    url: str = "redis://127.0.0.1:6379/0"

    def connect(self) -> Any:
        from bus.protocol import make_bus

        return make_bus(self.kind, url=self.url, prefix=self.prefix)


@dataclass
class _UpdateState:
    engine: GradientEngine
    sizes: dict[str, int] = field(default_factory=dict)
    busy_s: float = 0.0
    first_ready: float | None = None
    latencies: list[float] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)
    bus_latencies: list[float] = field(default_factory=list)
    aborted: set[str] = field(default_factory=set)
    max_staleness: int = 0


def weights_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "weights" / f"v{version:06d}"


def to_work_items(ev: SourceReady) -> list[WorkItem]:
    """Bus payload (full [prompt; continuation] layout) -> learner work items."""
    p = ev.prompt_len
    if ev.kind is SourceKind.OPD_TURN:
        mask = ev.action_mask[p:]
        tlp = ev.teacher_logprobs or []
        scored = [lp for lp, m in zip(tlp[p:], mask, strict=True) if m]
        return [
            OpdTurn(
                ev.source_id,
                ev.traj_id,
                ev.turn,
                tuple(ev.token_ids[p:]),
                tuple(mask),
                tuple(scored),
            )
        ]
    index = int(ev.traj_id.rsplit("#", 1)[-1])
    items: list[WorkItem] = []
    if ev.kind is SourceKind.GRPO_TRAJECTORY:
        items.append(
            GrpoContent(
                ev.source_id, ev.group_id, index, tuple(ev.token_ids[p:]), tuple(ev.action_mask[p:])
            )
        )
    if ev.reward is not None:
        items.append(GrpoReward(ev.source_id + "/reward", ev.group_id, index, float(ev.reward)))
    return items


class LearnerLoop:
    def __init__(self, spec: LearnerSpec, bus: Any) -> None:
        from learner.checkpoint import load_checkpoint
        from learner.trainer import Learner
        from tsrl.models import load_model

        self.spec = spec
        self.cfg = RunConfig.model_validate_json(spec.cfg_json)
        self.bus = bus
        name = f"learner-r{spec.rank}"
        self.sub = bus.subscribe("learner", name, name)  # every rank sees every event
        self.ctrl = bus.subscribe("control", name, name) if spec.rank == 0 else None
        self.once = ExactlyOnce(MemoryLedger())
        ctx = None
        if spec.world > 1:
            from learner.parallel import init_process_group

            ctx = init_process_group(spec.rank, spec.world, spec.port)
        self.learner = Learner(load_model(spec.model_dir), self.cfg, publish=self._publish, ctx=ctx)
        if spec.resume:
            load_checkpoint(self.learner, Path(spec.run_dir) / "checkpoints")
        sched = self.cfg.schedule
        self.release = sched if sched in LOSSLESS_SCHEDULES else Schedule.STREAM
        self.state = self._open()
        self.later: list[Event] = []
        self.n_params = sum(p.numel() for p in self.learner.params)

    @property
    def update(self) -> int:
        return self.learner.version

    def _open(self) -> _UpdateState:
        return _UpdateState(self.learner.open_update(self.release))

    # ---- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        now = time.time()
        self.bus.publish(  # the driver waits for this before opening the first update
            Span(
                run_id=self.spec.run_id,
                update=self.update,
                role=Role.LEARNER,
                kind="ready",
                ids={"version": str(self.update)},
                start=now,
                end=now,
            )
        )
        while self.update < self.cfg.updates:
            waiting_since = time.time()
            batch = self.sub.receive(timeout_s=0.5, max_count=256)
            got = time.time()
            for d in batch:
                if d.event.emitted_at >= waiting_since:  # arrived while idle: pure bus latency
                    self.state.bus_latencies.append(got - d.event.emitted_at)
            for d in batch:
                self.once.apply(self.sub, d, self._dispatch)
            fault = os.environ.get("TSRL_FAULT_KILL_LEARNER_AT_UPDATE")
            if (
                fault is not None
                and int(fault) == self.update
                and self.state.engine.counters["work_items"]
            ):
                os._exit(137)  # fault injection (tests): die mid-update, like a SIGKILL

    def _dispatch(self, ev: Event) -> None:
        upd = getattr(ev, "update", self.update)
        if upd > self.update:
            self.later.append(ev)  # async schedules: rollouts of k+1 arrive before the step of k
            return
        if upd < self.update:
            return  # a straggler of a finished update (its group was aborted and rerun)
        self._handle(ev)

    def _handle(self, ev: Event) -> None:
        st, eng = self.state, self.state.engine
        gid = getattr(ev, "group_id", None)
        if gid is not None and owner_rank(gid, self.spec.world) != self.spec.rank:
            return  # another rank's group: it contributes through the all-reduce
        if isinstance(ev, GroupRegistered):
            if self.cfg.objective is Objective.OPD:
                eng.register_trajectory(ev.group_id)
            else:
                st.sizes[ev.group_id] = ev.size
        elif isinstance(ev, SourceReady):
            now = time.time()
            st.latencies.append(now - ev.ready_at)
            st.max_staleness = max(st.max_staleness, self.learner.version - ev.policy_version)
            st.first_ready = ev.ready_at if st.first_ready is None else st.first_ready
            if self.spec.log_batches:
                st.logged.append(ev.model_dump_json())
            if ev.kind is not SourceKind.OPD_TURN and ev.group_id not in eng.group_specs:
                prompt = tuple(ev.token_ids[: ev.prompt_len])
                eng.register_group(GrpoGroupSpec(ev.group_id, prompt, st.sizes[ev.group_id]))
            for item in to_work_items(ev):
                st.ready[item.source_id] = ev.ready_at
                eng.submit(item, ev.ready_at)
            self._drain(ev.update)
        elif isinstance(ev, GroupClosed) and self.cfg.objective is Objective.OPD:
            close = OpdClose(f"{ev.group_id}/close", ev.group_id, ev.sources)
            st.ready[close.source_id] = ev.emitted_at  # the trajectory finished then
            eng.submit(close, ev.emitted_at)
            self._drain(ev.update)
        elif isinstance(ev, TrajectoryAborted):
            st.aborted.add(ev.traj_id)
            eng.abort(ev.traj_id if self.cfg.objective is Objective.OPD else ev.group_id)
            if self.cfg.objective is Objective.GRPO:
                st.sizes.pop(ev.group_id, None)
        elif isinstance(ev, BatchClosed):
            self._barrier(ev)

    def _drain(self, update: int) -> None:
        st = self.state
        eng = st.engine
        while True:
            t0 = time.time()
            item = eng.step_one()
            if item is None:
                return
            t1 = time.time()
            st.busy_s += t1 - t0
            ids = {"source": item.source_id, "group": item.key, "kind": type(item).__name__}
            self.bus.publish(
                Span(
                    run_id=self.spec.run_id,
                    update=update,
                    role=Role.LEARNER,
                    kind="work_item",
                    ids=ids,
                    start=t0,
                    end=t1,
                    ready=st.ready.get(item.source_id, t0),
                )
            )

    def _barrier(self, ev: BatchClosed) -> None:
        st = self.state
        st.engine.close_batch()
        self._drain(ev.update)
        t0 = time.time()
        stats = self.learner.step(st.engine)  # reduce, normalise, clip, step, publish + ack
        t1 = time.time()
        if self.spec.log_batches:
            path = Path(self.spec.run_dir) / "batches" / f"u{ev.update:05d}-r{self.spec.rank}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            kept = [
                x for x in st.logged if SourceReady.model_validate_json(x).traj_id not in st.aborted
            ]
            path.write_text("\n".join(kept) + "\n")
        every = self.cfg.checkpoint_every
        if every and self.learner.version % every == 0:
            from learner.checkpoint import save_checkpoint

            save_checkpoint(self.learner, Path(self.spec.run_dir) / "checkpoints")
        lat = sorted(st.latencies) or [0.0]
        bus_lat = sorted(st.bus_latencies) or [0.0]
        ids = {
            "L": f"{st.busy_s:.6f}",
            "reduce_s": f"{stats.reduce_s:.6f}",
            "step_s": f"{stats.step_s:.6f}",
            "publish_s": f"{stats.publish_s:.6f}",
            "tokens": str(st.engine.counters["tokens_forward"]),
            "work_items": str(st.engine.counters["work_items"]),
            "grad_norm": f"{stats.grad_norm:.6g}",
            "ready_to_recv_p99_ms": f"{1000 * _p99(lat):.3f}",
            "bus_p99_ms": f"{1000 * _p99(bus_lat):.3f}",
            "peak_rss_mb": f"{_peak_rss_mb():.1f}",
            "n_params": str(self.n_params),
            "max_staleness": str(st.max_staleness),
        }
        if self.spec.rank != 0:
            ids["rank"] = str(self.spec.rank)
        self.bus.publish(
            Span(
                run_id=self.spec.run_id,
                update=ev.update,
                role=Role.BARRIER if self.spec.rank == 0 else Role.LEARNER,
                kind="barrier",
                ids=ids,
                start=t0,
                end=t1,
            )
        )
        self.state = self._open()
        later, self.later = self.later, []
        for e in later:
            self._dispatch(e)

    def _publish(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        from rollout.checkpoint import save_checkpoint

        if self.spec.rank != 0:
            return version  # rank 0 publishes theta_{k+1} for everyone (identical on all ranks)
        uri = save_checkpoint(weights_dir(self.spec.run_dir, version), weights, self.spec.model_dir)
        self.bus.publish(PolicyPublished(run_id=self.spec.run_id, version=version, uri=str(uri)))
        waiting = set(self.spec.replicas)
        deadline = time.time() + self.spec.ack_timeout_s
        while waiting:
            if time.time() > deadline:
                raise TimeoutError(f"replicas {sorted(waiting)} did not acknowledge v{version}")
            assert self.ctrl is not None
            for d in self.ctrl.receive(timeout_s=0.5):
                e = d.event
                if isinstance(e, ReplicaAcked) and e.version == version:
                    waiting.discard(e.replica_id)
                self.ctrl.ack(d)
        return version


def _p99(xs: list[float]) -> float:
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def learner_main(spec: LearnerSpec, bus: Any) -> None:
    """Entry point of the learner process."""
    if spec.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.cpu})
    torch.set_num_threads(spec.threads)
    if isinstance(bus, BusRef):
        bus = bus.connect()
    try:
        LearnerLoop(spec, bus).run()
    except Exception:
        err = Path(spec.run_dir) / (
            "learner-error.txt" if spec.rank == 0 else f"learner-error-r{spec.rank}.txt"
        )
        err.write_text(traceback.format_exc())
        raise
