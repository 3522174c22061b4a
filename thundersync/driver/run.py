"""The run driver: one update after another, rollouts overlapping the learner in its own process.

    parts = models, learner ranks (cluster.placement), rollout parts (engine, teacher), bus
    for k in updates:
        stop here if CANCEL was requested (between barriers, never inside an optimizer step)
        register its OPD trajectories; run its trajectories (concurrency-limited, tools async)
          each reward-fixed GRPO trajectory -> (its group's registration with the prompt, once)
            GrpoRewardReady + GrpoTrajectoryReady; each teacher-scored OPD turn -> OpdTurnReady
        batch closed -> the learner steps -> theta_{k+1} published -> engine loads it -> ack
        metrics line from the learner's barrier stats; spans -> run dir
A failed trajectory is rerun from scratch under theta_k, dropped from its group or fails the run
(`rollout.on_failure`, `driver.rollouts`); for OPD its already-sent turns are aborted first, so
nothing partial reaches the learner. The stale comparison schedules live in
`driver.async_schedules`, fault injection for tests in `driver.faults`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thundersync import stages
from thundersync.bus.events import (
    BarrierStats,
    BatchClosed,
    PolicyPublished,
    ReplicaAcked,
    SourceReady,
    TrajectoryRegistered,
)
from thundersync.bus.factory import BusKind, open_run_bus, run_bus_kind
from thundersync.cluster.placement import LearnerGroup, NodePlacement, RunFailed, place_on_node
from thundersync.config import Objective, RunConfig, Schedule, revalidate
from thundersync.driver.assemble import RolloutParts, build_models, build_rollout_parts
from thundersync.driver.async_schedules import AsyncSchedule
from thundersync.driver.emit import EMITTERS, SourceEmitter, UpdateTally
from thundersync.driver.faults import FaultPlan
from thundersync.driver.metric_sinks import open_sinks
from thundersync.driver.metrics import Timeline, UpdateTimes, update_record
from thundersync.driver.rollouts import RolloutContext, run_trajectories
from thundersync.driver.tasks import plan_update, task_pool
from thundersync.driver.vllm_replicas import replica_ids
from thundersync.rollout.weight_wire import sweep_orphans
from thundersync.rundir import RunDirWriter, RunStatus
from thundersync.sandbox.envs.catalogue import TaskRef
from thundersync.worker.learner_proc import LearnerSpec
from thundersync.worker.policy_writer import remove_run_segments

EXIT_CANCELLED = 3
__all__ = ["EXIT_CANCELLED", "RunDriver", "RunFailed"]


class RunDriver:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        bus_kind: BusKind | str | None = None,
        log_batches: bool = False,
        ray_address: str | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        self.cfg = cfg = revalidate(cfg)  # refused here, not at the first group close
        self.files = RunDirWriter(Path(run_dir).absolute())  # the same path on every node
        # one bus namespace per attempt (a resume never reads a killed attempt's events), under
        # the service's run id when it launched us: its reconciler finds `tsrl:<run id>:*`
        attempt = f"{os.getpid()}-{int(time.time())}"
        service_id = os.environ.get("TSRL_RUN_ID")
        self.run_id = f"{service_id}:{attempt}" if service_id else f"{cfg.name}-{attempt}"
        self.resume, self.progress = resume, progress
        self.log_batches = log_batches or cfg.record_batches
        self.ray_address = ray_address
        self.bus_kind = run_bus_kind(bus_kind, on_ray=ray_address is not None)
        self.faults = faults or FaultPlan()
        self.stale: AsyncSchedule | None = None

    def run(self) -> int:
        try:
            with stages.listening(self.files.write_stage):  # DIR/stage.json, `stage:` lines
                code = self._run()
            if code == EXIT_CANCELLED:
                self.files.write_status(
                    RunStatus.CANCELLED, "cancel requested; stopped at a barrier"
                )
            else:
                self.files.write_status(RunStatus.SUCCEEDED)
            return code
        except BaseException as e:
            self.files.write_log(f"failed: {type(e).__name__}: {e}")
            self.files.write_status(RunStatus.FAILED, f"{type(e).__name__}: {e}")
            raise
        finally:
            self.files.close()

    def _start_version(self) -> int:
        if not self.resume:
            return 0
        from thundersync.learner.checkpoint import checkpoint_version

        # the format this run's ranks load: one torch.save file, or sharded (DCP) for FSDP2
        version = checkpoint_version(self.files.checkpoints, self.cfg.learner.ranks)
        if version is None:
            raise RunFailed(
                f"--resume: no checkpoint for {self.cfg.learner.ranks} learner rank(s) in "
                f"{self.files.checkpoints}; set checkpoint_every > 0"
            )
        return version

    def _run(self) -> int:
        import torch

        cfg = self.cfg
        student, teacher_dir = build_models(cfg, self.files)
        if self.ray_address is not None:  # the placement first: it decides the transport
            from thundersync.cluster.ray_learners import prepare_ray_run

            self.cfg, note = prepare_ray_run(cfg, self.ray_address)
            cfg = self.cfg
            self.files.write_log(note)
        node = place_on_node(cfg, on_ray=self.ray_address is not None)
        if self.ray_address is None:  # on Ray each learner rank checks its own node
            self._check_memory(student, node)
        for line in node.describe():
            self.files.write_log(line)
            print(line, file=sys.stderr, flush=True)
        self.files.write_config(cfg.model_dump_json(indent=2))
        version = self._start_version()
        if self.resume:
            dropped = self.files.drop_updates_from(version)
            self.files.write_log(f"resume at v{version}: dropped {dropped} lines of redone updates")
        self.files.sinks = open_sinks(cfg, self.files)  # TensorBoard / W&B (cfg.logging)
        asynchronous = cfg.schedule in (Schedule.ASYNC, Schedule.FULLY_ASYNC)
        self.bus, learner_bus = open_run_bus(
            self.bus_kind, run_id=self.run_id, learner_ranks=cfg.learner.ranks
        )
        spec = LearnerSpec(
            cfg.model_dump_json(),
            str(student),
            str(self.files.root),
            self.run_id,
            replicas=() if asynchronous else replica_ids(cfg),
            cpu=node.learner_cpu,
            resume=self.resume,
            log_batches=self.log_batches,
            plan_checked=self.ray_address is None,  # _check_memory ran above for this node
        )
        stages.report("learner", f"starting {cfg.learner.ranks} learner rank(s)")
        self.learners = LearnerGroup.start(
            spec, learner_bus, world=cfg.learner.ranks, ray_address=self.ray_address, gpus=node.gpus
        )
        recorded = node.to_json()
        if self.ray_address is not None:
            self.files.write_log(
                f"placement: {cfg.learner.ranks} learner rank(s) as Ray actors on {self.ray_address}"
            )
            if self.learners.placement is not None:
                recorded["ray"] = self.learners.placement.to_json()
        self.files.write_placement(recorded)
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if node.driver_cpus is not None:
            os.sched_setaffinity(0, node.driver_cpus)
        torch.set_num_threads(1)
        # generation threads hold the GIL between torch ops; a short switch interval lets the bus
        # feeder thread hand a ready source to the learner within a millisecond or so
        sys.setswitchinterval(0.0005)
        self.ctrl = self.bus.subscribe("control", "driver", "driver-0")
        self.timeline = Timeline(self.bus.subscribe("spans", "driver", "driver-0"), self.files)
        self.timeline.check_alive = self.learners.check_alive
        self.parts: RolloutParts | None = None
        self.peak_flops = self._peak_flops()
        finished = False
        try:
            stages.report("engine", f"starting the inference engine ({cfg.rollout.engine.value})")
            self.parts = build_rollout_parts(
                cfg,
                self.files,
                student=student,
                teacher_dir=teacher_dir,
                version=version,
                on_ray=self.ray_address is not None,
                gpus=node.gpus,
            )
            pool = task_pool(cfg)
            self.learners.wait_ready(self.timeline.sub)
            if asynchronous:
                fully = cfg.schedule is Schedule.FULLY_ASYNC
                self.stale = AsyncSchedule(
                    self.ctrl, self.parts.engine, fully=fully, check_alive=self.learners.check_alive
                )
            for k in range(version, cfg.updates):
                if self.files.cancel_requested:
                    return EXIT_CANCELLED
                if self.stale is not None:
                    self.stale.before_update(k)
                self._update(k, pool)
                if self.stale is not None:
                    self.stale.flush(self.timeline, self._write_metrics, block=False)
            if self.stale is not None:
                self.stale.flush(self.timeline, self._write_metrics, block=True)
            finished = True
            return 0
        finally:
            if self.stale is not None:
                self.stale.close()
            if self.parts is not None:
                for line in self.parts.report():
                    self.files.write_log(line)
                self.parts.close()
            self.learners.stop(finished=finished)
            remove_run_segments(self.run_id)  # what a killed learner left in shared memory
            sweep_orphans()  # and what killed runs before this one left
            if self.bus_kind is BusKind.REDIS:
                self.bus.delete("learner", "control", "spans")  # type: ignore[attr-defined]
            self.bus.close()
            if affinity is not None:
                os.sched_setaffinity(0, affinity)

    def _check_memory(self, student: Path, node: NodePlacement) -> None:
        """The memory plan against this node before anything starts (`plan.guard`): a run that
        cannot fit is refused here, naming the knob, instead of dying at its first barrier."""
        from thundersync.cluster.ray_plan import PlacementRole
        from thundersync.learner.device import resolve_device
        from thundersync.plan.guard import check_run_memory

        gpu = None
        if resolve_device(self.cfg.learner.device).type == "cuda":
            slot = node.gpus.of(PlacementRole.LEARNER) if node.gpus is not None else None
            gpu = slot.first if slot is not None else 0
        plan = check_run_memory(self.cfg, student, gpu)
        if plan is None:
            self.files.write_log(f"memory plan: skipped ({student}/config.json has no known shape)")
            return
        self.files.write_log(
            f"memory plan: {plan.per_gpu_bytes / 1e9:.2f} GB per learner GPU, "
            f"{plan.host_bytes / 1e9:.2f} GB host (fits)"
        )

    def _peak_flops(self) -> float:
        """The learner's peak for MFU (thundersync/peak.py: config, a GPU's datasheet, or the
        CPU measured once per machine on one thread, as the learner runs), said in the log."""
        from thundersync.learner.device import DTYPES, resolve_device
        from thundersync.peak import mfu_peak

        device = resolve_device(self.cfg.learner.device)
        dtype = DTYPES[self.cfg.model.dtype]
        peak, source = mfu_peak(self.cfg.mfu_peak_flops, device, dtype)
        self.files.write_log(f"mfu: peak {peak:.3g} FLOP/s ({source})")
        return peak

    def _update(self, k: int, pool: list[TaskRef]) -> None:
        cfg, parts = self.cfg, self.parts
        assert parts is not None
        t0 = time.time()
        plans = plan_update(cfg, pool, k, on_ray=self.ray_address is not None)
        groups = sorted({p.group_id for p in plans})
        grpo = cfg.objective is Objective.GRPO
        if not grpo:  # a GRPO group registers with its first source: its prompt is known then
            for g in groups:
                self.bus.publish(TrajectoryRegistered(run_id=self.run_id, update=k, traj_id=g))
        emitter: SourceEmitter = EMITTERS[cfg.objective](
            bus=self.bus,
            run_id=self.run_id,
            update=k,
            policy_version=lambda: parts.engine.version,
            plans={p.traj_id: p for p in plans},
            files=self.files,
            group_size=cfg.rollout.group_size if grpo else 1,
            after_publish=self._after_publish,
        )
        ctx = RolloutContext(cfg, parts, self.bus, self.run_id, self.faults, self.files.write_log)
        stages.report("rollouts", f"update {k}: rollouts", k + 1, cfg.updates)
        asyncio.run(run_trajectories(ctx, k, plans, emitter))
        stages.report("learner", f"update {k}: learner step", k + 1, cfg.updates)
        tally = emitter.tally
        r_end = tally.last_ready or time.time()
        self.bus.publish(
            BatchClosed(run_id=self.run_id, update=k, groups=len(groups), sources=tally.sources)
        )
        if self.stale is not None:  # the next rollouts start now; metrics come with the step
            self.stale.defer(k, t0, r_end, tally)
            return
        pub = self._serve_published(k + 1)
        stats = self.timeline.barrier(k)
        self._write_metrics(k, UpdateTimes(t0, r_end, time.time()), tally, stats, pub.version)

    def _after_publish(self, events: list[SourceReady], sources: int) -> None:
        for ev in events:
            for copy in self.faults.copies(ev):
                self.bus.publish(copy)
        assert self.parts is not None
        self.faults.after_source(
            events[0].update,
            sources,
            kill_teacher=self._kill_teacher,
            kill_learner=self.learners.kill,
        )

    def _kill_teacher(self) -> None:
        assert self.parts is not None
        self.parts.kill_teacher()
        self.files.write_log("fault injection: teacher server killed")

    def _write_metrics(
        self,
        k: int,
        times: UpdateTimes,
        tally: UpdateTally,
        stats: BarrierStats | None,
        version: int,
    ) -> None:
        rec = update_record(self.cfg, k, times, tally, stats, version, self.peak_flops)
        if self.parts is not None and version in self.parts.loads:
            rec.update(self.parts.loads[version])
        self.files.write_update(rec)
        dropped = f" dropped {rec['dropped_trajectories']}" if rec["dropped_trajectories"] else ""
        self.files.write_log(
            f"update {k}: step {rec['step_s']:.2f}s reward {rec['reward_mean']:.3f}{dropped}"
        )
        if self.progress is not None:
            self.progress(rec)

    def _serve_published(self, version: int) -> PolicyPublished:
        """Wait for theta_{version}, load it into the engine and acknowledge it (lossless path)."""
        assert self.parts is not None
        while True:
            for d in self.ctrl.receive(timeout_s=0.5):
                e = d.event
                self.ctrl.ack(d)
                if isinstance(e, PolicyPublished) and e.version == version:
                    # every replica loads it (in parallel) before any ack: all-or-nothing
                    ack = self.parts.engine.load_weights(version, e.uri)
                    self.faults.at_publish(version, kill_learner=self.learners.kill)
                    for rid in replica_ids(self.cfg):
                        self.bus.publish(
                            ReplicaAcked(run_id=self.run_id, replica_id=rid, version=ack.version)
                        )
                    self.parts.loads[version] = {
                        "acked_by": replica_ids(self.cfg),
                        "load_method": ack.method,
                        "load_s": round(ack.seconds, 4),
                    }
                    return e
            self.learners.check_alive(f"update {version - 1}")
