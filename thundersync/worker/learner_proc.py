"""The learner process: applies every ready source the moment it arrives, steps at the barrier.

It runs in its own process (own interpreter, own core) so that its backward passes truly overlap
with rollout. Its loop is the data flow of docs/DESIGN.md, from the learner's side:
    source ready -> backward at once (the schedule decides when a source is released)
    batch closed -> drain -> barrier: reduce, normalise, clip, one AdamW step
                 -> write theta_{k+1} (shared memory), publish it, wait for every replica's ack
Events of a later update (async schedules) wait in a buffer until that update opens. Each source
is applied once (ledger by source id), so a redelivered or duplicated event never counts twice.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

import torch

from thundersync.bus.events import (
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    LearnerReady,
    OpdTurnReady,
    PolicyPublished,
    ReplicaAcked,
    Role,
    Span,
    TrajectoryAborted,
    TrajectoryRegistered,
)
from thundersync.bus.factory import BusRef, connect
from thundersync.bus.ledger import ExactlyOnce, MemoryLedger
from thundersync.bus.protocol import Bus
from thundersync.config import LOSSLESS_SCHEDULES, Objective, RunConfig, Schedule
from thundersync.learner.sources import Dropped, GrpoGroupSpec, OpdClose
from thundersync.rundir import RunFiles
from thundersync.worker.learner_stats import UpdateState
from thundersync.worker.policy_writer import PolicyWriter
from thundersync.worker.work_items import owner_key, owner_rank, to_work_item

# a learner's torch threads: fp32 matmul results depend on the thread count, so a replay
# (`driver.replay_gap.replay_gap`) must use the same one to reproduce the run bit for bit
LEARNER_THREADS = 1


@dataclass
class LearnerSpec:
    """Everything the learner process needs (picklable: it crosses the spawn boundary)."""

    cfg_json: str
    model_dir: str
    run_dir: str
    run_id: str
    replicas: tuple[str, ...] = ("engine-0",)
    cpu: int | None = None
    threads: int = LEARNER_THREADS
    resume: bool = False
    log_batches: bool = False
    ack_timeout_s: float = 120.0
    rank: int = 0
    world: int = 1
    port: int = 0  # gloo rendezvous when world > 1
    parent_pid: int | None = None  # a local learner dies with this driver process
    cuda_devices: str | None = None  # this rank's CUDA_VISIBLE_DEVICES (local plan), None: as is
    plan_checked: bool = False  # the driver checked the memory plan for this node already


class LearnerLoop:
    def __init__(self, spec: LearnerSpec, bus: Bus) -> None:
        from thundersync.hf_models import load_model
        from thundersync.learner.checkpoint import load_checkpoint
        from thundersync.learner.device import DTYPES, resolve_device
        from thundersync.learner.trainer import Learner

        self.spec = spec
        self.files = RunFiles(spec.run_dir)
        self.cfg = RunConfig.model_validate_json(spec.cfg_json)
        self.bus = bus
        name = f"learner-r{spec.rank}"
        self.sub = bus.subscribe("learner", name, name)  # every rank sees every event
        self.ctrl = bus.subscribe("control", name, name) if spec.rank == 0 else None
        self.once = ExactlyOnce(MemoryLedger())
        ctx = None
        if spec.world > 1:
            from thundersync.learner.parallel import init_process_group

            device = resolve_device(self.cfg.learner.device)
            ctx = init_process_group(spec.rank, spec.world, spec.port, device)
        if not spec.plan_checked:  # placed by Ray: check the node this rank landed on
            from thundersync.plan.guard import check_run_memory

            on_cuda = resolve_device(self.cfg.learner.device).type == "cuda"
            check_run_memory(self.cfg, spec.model_dir, 0 if on_cuda else None)
        model = load_model(spec.model_dir, dtype=DTYPES[self.cfg.model.dtype])
        owners = (os.getpid(), *([spec.parent_pid] if spec.parent_pid else []))
        self.writer = PolicyWriter(
            self.cfg,
            self.files,
            spec.model_dir,
            spec.run_id,
            owners,
            every_version_on_disk=spec.log_batches,
            acked=bool(spec.replicas),
        )
        self.learner = Learner(model, self.cfg, publish=self._publish, ctx=ctx)
        if spec.resume:
            load_checkpoint(self.learner, self.files.checkpoints)
        sched = self.cfg.schedule
        self.release = sched if sched in LOSSLESS_SCHEDULES else Schedule.STREAM
        self.state = self._open()
        self.later: list[Event] = []
        self.n_params = sum(p.numel() for p in self.learner.params)

    @property
    def update(self) -> int:
        return self.learner.version

    def _open(self) -> UpdateState:
        return UpdateState(self.learner.open_update(self.release))

    # ---- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        ready = LearnerReady(run_id=self.spec.run_id, rank=self.spec.rank, version=self.update)
        self.bus.publish(ready)  # the driver waits for every rank before opening an update
        while self.update < self.cfg.updates:
            waiting_since = time.time()
            batch = self.sub.receive(timeout_s=0.5, max_count=256)
            got = time.time()
            for d in batch:
                if d.event.emitted_at >= waiting_since:  # arrived while idle: pure bus latency
                    self.state.bus_latencies.append(got - d.event.emitted_at)
            for d in batch:
                self.once.apply(self.sub, d, self._dispatch)

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
        key = owner_key(ev)
        if key is not None and owner_rank(key, self.spec.world) != self.spec.rank:
            return  # another rank's group: it contributes through the all-reduce
        match ev:
            case TrajectoryRegistered():
                eng.register_trajectory(ev.traj_id)
            case GroupRegistered():
                st.registered(ev, log=self.spec.log_batches)
                eng.register_group(GrpoGroupSpec(ev.group_id, tuple(ev.prompt_ids), ev.size))
            case GrpoRewardReady() | GrpoTrajectoryReady() | OpdTurnReady():
                st.received(ev, self.learner.version, log=self.spec.log_batches)
                item = to_work_item(ev)
                st.ready[item.source_id] = ev.ready_at
                eng.submit(item, ev.ready_at)
                self._drain(ev.update)
            case GroupClosed() if self.cfg.objective is Objective.OPD:
                close = OpdClose(f"{ev.group_id}/close", ev.group_id, ev.sources)
                st.ready[close.source_id] = ev.emitted_at  # the trajectory finished then
                eng.submit(close, ev.emitted_at)
                self._drain(ev.update)
            case TrajectoryAborted() if ev.dropped:  # rollout.on_failure: drop
                opd = self.cfg.objective is Objective.OPD
                eng.drop(Dropped(ev.event_id, ev.traj_id if opd else ev.group_id, ev.index))
                st.dropped(ev, whole=ev.group_id in eng.dropped)
            case TrajectoryAborted():
                st.aborted.add(ev.traj_id)
                eng.abort(ev.traj_id if self.cfg.objective is Objective.OPD else ev.group_id)
            case BatchClosed():
                self._barrier(ev)

    def _drain(self, update: int) -> None:
        st = self.state
        while True:
            t0 = time.time()
            item = st.engine.step_one()
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
            path = self.files.batch_log(ev.update, self.spec.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(x + "\n" for x in st.kept_log()))
        every = self.cfg.checkpoint_every
        if every and self.learner.version % every == 0:
            from thundersync.learner.checkpoint import save_checkpoint

            save_checkpoint(self.learner, self.files.checkpoints)
        self.bus.publish(
            st.barrier_stats(
                run_id=self.spec.run_id,
                update=ev.update,
                rank=self.spec.rank,
                step=stats,
                start=t0,
                end=t1,
                n_params=self.n_params,
                distill_ctx=self.learner.ctx if self.cfg.objective is Objective.OPD else None,
            )
        )
        self.state = self._open()
        later, self.later = self.later, []
        for e in later:
            self._dispatch(e)

    def _publish(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        if self.spec.rank != 0:
            return version  # rank 0 publishes theta_{k+1} for everyone (identical on all ranks)
        uri = self.writer.write(version, weights)
        self.bus.publish(PolicyPublished(run_id=self.spec.run_id, version=version, uri=uri))
        self.writer.send(version, weights)  # broadcast: the replicas join it as they load
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
        # stale schedules load up to one version behind without acking: keep one more for them
        self.writer.prune(version if self.spec.replicas else version - 1)
        return version


def where_info() -> dict[str, object]:
    """What this process was given: its host, GPUs and cores (the run dir's where/*.json)."""
    import socket

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpus": cpus,
    }


def learner_main(spec: LearnerSpec, bus: Bus | BusRef) -> None:
    """Entry point of the learner process."""
    if spec.parent_pid is not None:
        from thundersync.lifecycle import die_with_parent

        die_with_parent(spec.parent_pid)  # a SIGKILLed driver takes its learner with it
    if spec.cuda_devices is not None:  # before the first CUDA call, which reads it once
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_devices
    if spec.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.cpu})
    torch.set_num_threads(spec.threads)
    RunFiles(spec.run_dir).record_where(f"learner-{spec.rank}", where_info())
    try:
        LearnerLoop(spec, connect(bus)).run()
    except Exception:
        RunFiles(spec.run_dir).learner_error(spec.rank).write_text(traceback.format_exc())
        raise
