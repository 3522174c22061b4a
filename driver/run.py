"""The run driver: one update after another, rollouts overlapping the learner in its own process.

    for k in updates:
        register the update's groups; run trajectories (concurrency-limited, tools async)
          each finished trajectory (GRPO) / teacher-scored turn (OPD) -> SourceReady on the bus
        batch closed -> the learner steps -> theta_{k+1} published -> engine loads it -> ack
        metrics + spans -> run dir; checkpoint every N (learner side); CANCEL checked here,
        i.e. between barriers, never inside an optimizer step
A failed trajectory is rerun from scratch under theta_k; for OPD its already-sent turns are
aborted first, so nothing partial reaches the learner.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bus.events import (
    BatchClosed,
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
from driver.learner_proc import BusRef, LearnerSpec, learner_main, weights_dir
from driver.rundir import RunDir
from driver.tasks import PlannedTrajectory, plan_update, task_pool
from rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
from rollout.trajectory import Trajectory, Turn
from rollout.types import SamplingParams
from rollout.vllm_server import free_port
from tsrl.config import Objective, RunConfig, Schedule

EXIT_CANCELLED = 3


class RunFailed(RuntimeError):
    pass


class _Callbacks:
    """Agent-loop callbacks -> bus events (called on the rollout event loop thread)."""

    def __init__(self, driver: RunDriver, update: int, plans: dict[str, PlannedTrajectory]) -> None:
        self.d, self.update, self.plans = driver, update, plans
        self.sources = 0
        self.last_ready = 0.0
        self.rewards: list[float] = []
        self.tokens = 0

    def _src(self, **kw: Any) -> None:
        ev = SourceReady(
            run_id=self.d.run_id, update=self.update, policy_version=self.d.engine.version, **kw
        )
        self.d.bus.publish(ev)
        if self.d.duplicate_sources:  # fault injection: a publisher retrying after a lost ack
            self.d.bus.publish(ev.model_copy(update={"event_id": ev.event_id + "-retry"}))
        self.sources += 1
        if self.update == 1 and self.sources == self.d.kill_teacher_after:
            self.d.kill_teacher()
        self.last_ready = max(self.last_ready, ev.ready_at)

    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        if self.d.cfg.objective is not Objective.OPD:
            return
        prompt, resp = traj.prompt_ids, traj.response_ids
        end = turn.context_len + len(turn.action_ids)
        ids = (prompt + resp)[: end - len(turn.action_ids)] + list(turn.action_ids)
        mask = [0] * (end - len(turn.action_ids)) + [1] * len(turn.action_ids)
        tlp = [0.0] * (end - len(turn.action_ids)) + list(turn.teacher_logprobs or [])
        start = (
            0
            if turn.index == 0
            else traj.turns[turn.index - 1].context_len + len(traj.turns[turn.index - 1].action_ids)
        )
        self._src(
            kind=SourceKind.OPD_TURN,
            source_id=f"{traj.trajectory_id}/turn{turn.index}",
            group_id=traj.trajectory_id,
            traj_id=traj.trajectory_id,
            turn=turn.index,
            token_ids=ids,
            action_mask=mask,
            prompt_len=start,
            teacher_logprobs=tlp,
        )

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        self.rewards.append(reward)
        if self.d.cfg.objective is not Objective.GRPO:
            return
        plan = self.plans[traj.trajectory_id]
        self._src(
            kind=SourceKind.GRPO_TRAJECTORY,
            source_id=traj.trajectory_id,
            group_id=plan.group_id,
            traj_id=traj.trajectory_id,
            token_ids=traj.prompt_ids + traj.response_ids,
            action_mask=[0] * len(traj.prompt_ids) + traj.loss_mask,
            prompt_len=len(traj.prompt_ids),
            reward=reward,
        )

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        self.tokens += len(traj.response_ids)
        if self.d.cfg.objective is Objective.OPD:
            self.d.bus.publish(
                GroupClosed(
                    run_id=self.d.run_id,
                    update=self.update,
                    group_id=traj.trajectory_id,
                    sources=len(traj.turns),
                )
            )
        self.d.rundir.spans(_turn_spans(traj, self.update))


def _turn_spans(traj: Trajectory, update: int) -> list[dict[str, Any]]:
    out = []
    for t in traj.turns:
        ids = {"traj": traj.trajectory_id, "turn": str(t.index)}
        out.append(
            {
                "type": "span",
                "update": update,
                "role": "rollout",
                "kind": "generate",
                "ids": ids,
                "start": t.gen_start,
                "end": t.gen_end,
            }
        )
        if t.tool_start is not None and t.tool_end is not None:
            out.append(
                {
                    "type": "span",
                    "update": update,
                    "role": "tool",
                    "kind": "tool_call",
                    "ids": ids,
                    "start": t.tool_start,
                    "end": t.tool_end,
                }
            )
        if t.teacher_start is not None and t.teacher_end is not None:
            out.append(
                {
                    "type": "span",
                    "update": update,
                    "role": "teacher",
                    "kind": "score",
                    "ids": ids,
                    "start": t.teacher_start,
                    "end": t.teacher_end,
                }
            )
    return out


class RunDriver:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        bus_kind: str = "process",
        log_batches: bool = False,
        fail_first: Sequence[str] = (),
        kill_teacher_after: int | None = None,
        duplicate_sources: bool = False,
        ray_address: str | None = None,
        progress: Any = None,
    ) -> None:
        self.cfg = cfg
        self.rundir = RunDir(run_dir)
        self.run_id = f"{cfg.name}-{os.getpid()}-{int(time.time())}"
        self.resume = resume
        self.bus_kind = bus_kind
        self.log_batches = log_batches
        self.fail_first = set(
            fail_first
        )  # fault injection for tests: these trajectories crash once
        self.progress = progress
        self.kill_teacher_after = kill_teacher_after  # fault injection (tests), during update 1
        self.duplicate_sources = duplicate_sources
        self.ray_address = ray_address
        if ray_address is not None and bus_kind != "redis":
            raise RunFailed("Ray placement needs a broker: pass --bus redis with --ray")
        self.start_update = 0
        self.teacher_server: Any = None
        self._completed = False
        self._barriers: dict[int, Span] = {}

    # ---- set-up ----------------------------------------------------------------------------
    def _models(self) -> tuple[Path, Path | None]:
        from tsrl.models import build_tiny_model, load_tokenizer

        root = self.rundir.path
        if self.cfg.model.path:
            student = Path(self.cfg.model.path)
        else:
            student = root / "model"
            if not (student / "config.json").exists():
                build_tiny_model(
                    student,
                    seed=self.cfg.model.tiny_seed,
                    hidden=self.cfg.model.tiny_hidden,
                    layers=self.cfg.model.tiny_layers,
                )
        teacher: Path | None = None
        if self.cfg.objective is Objective.OPD:
            if self.cfg.teacher.model == "smollm2":
                # the real 135M teacher; the tiny student shares its tokenizer (OPD needs one vocab)
                from tsrl.smollm2 import build_smollm2

                teacher = root / "teacher"
                if not (teacher / "config.json").exists():
                    build_smollm2(teacher)
                if not self.cfg.model.path and not (root / "model" / ".from-teacher").exists():
                    build_tiny_model(
                        student,
                        seed=self.cfg.model.tiny_seed,
                        hidden=self.cfg.model.tiny_hidden,
                        layers=self.cfg.model.tiny_layers,
                        tokenizer=load_tokenizer(teacher),
                    )
                    (root / "model" / ".from-teacher").write_text("")
            elif self.cfg.teacher.model:
                teacher = Path(self.cfg.teacher.model)
            else:
                teacher = root / "teacher"
                if not (teacher / "config.json").exists():
                    build_tiny_model(
                        teacher,
                        seed=self.cfg.model.tiny_seed + 1,
                        tokenizer=load_tokenizer(student),
                        hidden=128 if self.cfg.teacher.backend == "vllm" else 64,
                    )
        return student, teacher

    def _scorer(self, teacher_dir: Path) -> Any:
        """The frozen teacher: in-process HF (embedded default) or a supervised vLLM server."""
        if self.cfg.teacher.backend == "hf" and self.ray_address is not None:
            from driver.ray_placement import RayScorer

            return RayScorer(str(teacher_dir))
        if self.cfg.teacher.backend == "hf":
            from teacher.scorer import HFScorer

            return HFScorer.from_dir(teacher_dir)
        if self.cfg.teacher.backend != "vllm":
            raise RunFailed(f"teacher.backend {self.cfg.teacher.backend!r}: use hf or vllm")
        from rollout.vllm_server import VLLMServer, VLLMServerConfig
        from teacher.supervised import SupervisedVLLMScorer

        self.teacher_server = VLLMServer(
            VLLMServerConfig(model=str(teacher_dir)), log_dir=self.rundir.path / "teacher"
        )
        self.teacher_server.start()
        return SupervisedVLLMScorer(self.teacher_server)

    def _placement(self) -> tuple[int | None, int | None]:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) >= 2:
            return cpus[0], cpus[-1]  # rollout side, learner
        return None, None

    def _make_bus(self) -> tuple[Any, Any]:
        """(the driver's bus, what the learner process is given to reach it)."""
        if self.bus_kind == "process":
            from bus.mp import ProcessBus, learner_routes

            bus = ProcessBus(learner_routes(self.cfg.learner.ranks))
            return bus, bus
        url = os.environ.get(
            "TSRL_REDIS_URL", "redis://127.0.0.1:6379/0"
        )  # cluster: a shared broker
        ref = BusRef(self.bus_kind, prefix=f"tsrl:{self.run_id}", url=url)
        return ref.connect(), ref

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        try:
            code = self._run()
            self.rundir.status(
                "cancelled" if code == EXIT_CANCELLED else "succeeded",
                "cancel requested; stopped at a barrier" if code == EXIT_CANCELLED else "",
            )
            return code
        except BaseException as e:
            self.rundir.log(f"failed: {type(e).__name__}: {e}")
            self.rundir.status("failed", f"{type(e).__name__}: {e}")
            raise
        finally:
            self.rundir.close()

    def _run(self) -> int:
        import torch

        from rollout.chat import TokenizerChatFormat
        from rollout.hf_engine import HFEngine
        from tsrl.models import load_tokenizer

        cfg = self.cfg
        student, teacher_dir = self._models()
        roll_cpu, learn_cpu = self._placement()
        self.rundir.log(f"placement: rollout+driver on cpu {roll_cpu}, learner on cpu {learn_cpu}")
        (self.rundir.path / "config.json").write_text(cfg.model_dump_json(indent=2))
        version = 0
        if self.resume:
            from learner.checkpoint import checkpoint_path

            ck = checkpoint_path(self.rundir.path / "checkpoints")
            if not ck.exists():
                raise RunFailed(f"--resume: no checkpoint at {ck}; set checkpoint_every > 0")
            version = int(torch.load(ck, weights_only=False)["version"])
        self.start_update = version
        self.bus, bus_for_learner = self._make_bus()
        asynchronous = cfg.schedule in (Schedule.ASYNC, Schedule.FULLY_ASYNC)
        spec = LearnerSpec(
            cfg.model_dump_json(),
            str(student),
            str(self.rundir.path),
            self.run_id,
            replicas=() if asynchronous else ("engine-0",),
            cpu=learn_cpu,
            resume=self.resume,
            log_batches=self.log_batches,
        )
        from dataclasses import replace

        world = cfg.learner.ranks
        port = free_port() if world > 1 else 0
        specs = [replace(spec, rank=r, world=world, port=port) for r in range(world)]
        if world > 1:  # ranks share the learner core(s); the rollout side keeps its own
            specs = [replace(sp, cpu=None) for sp in specs]
        procs: list[Any] = []
        if self.ray_address is not None:
            from driver.ray_placement import RayLearnerHandle

            procs = [
                RayLearnerHandle(replace(sp, cpu=None), bus_for_learner, self.ray_address)
                for sp in specs
            ]
            self.rundir.log(
                f"placement: {world} learner rank(s) as Ray actors on {self.ray_address}"
            )
        else:
            ctx = mp.get_context("spawn")
            procs = [
                ctx.Process(target=learner_main, args=(sp, bus_for_learner), daemon=True)
                for sp in specs
            ]
        self.proc = _LearnerGroup(procs)
        self.proc.start()
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if roll_cpu is not None:
            os.sched_setaffinity(0, {roll_cpu})
        torch.set_num_threads(1)
        # generation threads hold the GIL between torch ops; a short switch interval lets the bus
        # feeder thread hand a ready source to the learner within a millisecond or so
        sys.setswitchinterval(0.0005)
        self.ctrl = self.bus.subscribe("control", "driver", "driver-0")
        self.span_sub = self.bus.subscribe("spans", "driver", "driver-0")
        start_weights = weights_dir(self.rundir.path, version) if version else student
        self.engine: Any
        if self.ray_address is not None:
            from driver.ray_placement import RayEngine

            self.engine = RayEngine(str(start_weights), version=version)
        else:
            self.engine = HFEngine(start_weights, version=version)
        tok = load_tokenizer(student)
        teacher = None
        self.teacher_server = None
        if teacher_dir is not None:
            from teacher.client import TeacherClient

            teacher = TeacherClient(
                self._scorer(teacher_dir),
                timeout_s=cfg.teacher.timeout_s,
                retries=cfg.teacher.retries,
                backoff_s=0.2,
            )
        self.loop_cfg = AgentLoopConfig(
            max_turns=cfg.rollout.max_turns,
            sampling=SamplingParams(
                max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature
            ),
            concurrency=1,
            tool_workers=2,
        )
        self.chat = TokenizerChatFormat(tok)
        self.teacher = teacher
        pool = task_pool(cfg)
        self._wait_learner_ready()
        try:
            self._pending: dict[int, tuple[float, float, _Callbacks]] = {}
            if asynchronous:
                self._start_listener(fully=cfg.schedule is Schedule.FULLY_ASYNC)
            for k in range(version, cfg.updates):
                if self.rundir.cancel_requested:
                    return EXIT_CANCELLED
                if cfg.schedule is Schedule.ASYNC and k >= 1:
                    self._await_version(k - 1)
                self._update(k, pool, asynchronous)
                if asynchronous:
                    self._flush_pending(block=False)
            if asynchronous:
                self._flush_pending(block=True)
                self._stop_listener.set()
            self._completed = True
            return 0
        finally:
            if teacher is not None:
                teacher.close()
            if self.teacher_server is not None:
                self.teacher_server.stop()
            # a finished learner exits by itself after its last barrier; after a cancel or a
            # failure it waits for an update that will never come, so it is stopped (it is idle
            # between barriers: no optimizer step is cut short)
            self.proc.join(timeout=30 if self._completed else 0.5)
            self.proc.terminate()
            self.proc.join(timeout=10)
            if self.ray_address is not None:
                from driver.ray_placement import reset_sandbox_workers

                self.engine.close()
                reset_sandbox_workers()
            if self.bus_kind == "redis":
                self.bus.delete("learner", "control", "spans")
            self.bus.close()
            if affinity is not None:
                os.sched_setaffinity(0, affinity)

    def _update(self, k: int, pool: list[Any], asynchronous: bool) -> None:
        cfg = self.cfg
        t0 = time.time()
        plans = plan_update(cfg, pool, k, on_ray=self.ray_address is not None)
        by_traj = {p.traj_id: p for p in plans}
        groups = sorted({p.group_id for p in plans})
        for g in groups:
            size = cfg.rollout.group_size if cfg.objective is Objective.GRPO else 1
            self.bus.publish(GroupRegistered(run_id=self.run_id, update=k, group_id=g, size=size))
        cb = _Callbacks(self, k, by_traj)
        asyncio.run(self._rollouts(k, plans, cb))
        r_end = cb.last_ready or time.time()
        self.bus.publish(
            BatchClosed(run_id=self.run_id, update=k, groups=len(groups), sources=cb.sources)
        )
        if asynchronous:  # the next rollouts start now; this update's metrics come with its step
            self._pending[k] = (t0, r_end, cb)
            return
        pub = self._wait_published(k + 1)
        barrier = self._collect_spans(k)
        self._write_metrics(k, t0, r_end, cb, barrier, pub.version, time.time())

    def _write_metrics(
        self,
        k: int,
        t0: float,
        r_end: float,
        cb: _Callbacks,
        barrier: Span | None,
        version: int,
        t_end: float,
    ) -> None:
        cfg = self.cfg
        ids = barrier.ids if barrier is not None else {}
        L = float(ids.get("L", 0.0))
        P = (barrier.end - barrier.start) if barrier is not None else 0.0
        step_s = t_end - t0
        n_params, tokens = int(ids.get("n_params", 0)), int(ids.get("tokens", 0))
        flops = 6.0 * n_params * tokens
        rec = {
            "update": k,
            "schedule": cfg.schedule.value,
            "time": t_end,
            "step_s": step_s,
            "R": r_end - t0,
            "L": L,
            "P": P,
            "idle_share": max(0.0, 1.0 - (L + P) / step_s) if step_s > 0 else 0.0,
            "mfu": flops / (max(L + P, 1e-9) * cfg.mfu_peak_flops),
            "mfu_wall": flops / (step_s * cfg.mfu_peak_flops),
            "reward_mean": sum(cb.rewards) / len(cb.rewards) if cb.rewards else 0.0,
            "tokens": cb.tokens,
            "learner_tokens": tokens,
            "sources": cb.sources,
            "bus_p99_ms": float(ids.get("bus_p99_ms", 0.0)),
            "ready_to_recv_p99_ms": float(ids.get("ready_to_recv_p99_ms", 0.0)),
            "learner_peak_rss_mb": float(ids.get("peak_rss_mb", 0.0)),
            "grad_norm": float(ids.get("grad_norm", 0.0)),
            "max_staleness": int(ids.get("max_staleness", 0)),
            "version": version,
        }
        self.rundir.update(rec)
        self.rundir.log(f"update {k}: step {step_s:.2f}s reward {rec['reward_mean']:.3f}")
        if self.progress is not None:
            self.progress(rec)

    async def _rollouts(self, k: int, plans: list[PlannedTrajectory], cb: _Callbacks) -> None:
        sem = asyncio.Semaphore(self.cfg.rollout.concurrency)
        loop = AgentLoop(self.engine, self.chat, self.loop_cfg, callbacks=cb, teacher=self.teacher)

        async def one(plan: PlannedTrajectory) -> None:
            attempt, task, tid = 0, plan.task, plan.traj_id
            while True:
                try:
                    async with sem:
                        if tid in self.fail_first:  # fault injection (tests): crash once
                            self.fail_first.discard(tid)
                            task = _crashing(task, min(1, self.cfg.rollout.max_turns - 1))
                        pinned = (
                            None
                            if self.cfg.schedule is Schedule.FULLY_ASYNC
                            else self.engine.version
                        )
                        await loop.arun([task], version=pinned)
                    return
                except Exception as e:  # a rollout worker died: rerun from scratch under theta_k
                    attempt += 1
                    self.rundir.log(f"trajectory {tid} failed ({e!r}); rerun #{attempt}")
                    if attempt > 3:
                        raise RunFailed(f"trajectory {tid} failed {attempt} times: {e}") from e
                    if self.cfg.objective is Objective.OPD:  # drop the turns it already sent
                        self.bus.publish(
                            TrajectoryAborted(
                                run_id=self.run_id,
                                update=k,
                                traj_id=tid,
                                group_id=tid,
                                reason=repr(e),
                            )
                        )
                    task = RolloutTask(
                        f"{plan.task.instance_id}~a{attempt}",
                        plan.task.make_env,
                        plan.task.prompt,
                        plan.task.repetition,
                        plan.task.seed,
                    )
                    tid = f"{task.instance_id}#{task.repetition}"
                    cb.plans[tid] = plan
                    if self.cfg.objective is Objective.OPD:
                        self.bus.publish(
                            GroupRegistered(run_id=self.run_id, update=k, group_id=tid, size=1)
                        )

        await asyncio.gather(*(one(p) for p in plans))

    # ---- async / fully_async (compared against, not lossless) ------------------------------
    def _start_listener(self, fully: bool) -> None:
        """Receives every published policy; fully_async loads it at once, even mid-trajectory."""
        import threading

        self._published: dict[int, str] = {}
        self._stop_listener = threading.Event()

        def listen() -> None:
            while not self._stop_listener.is_set():
                for d in self.ctrl.receive(timeout_s=0.2):
                    self.ctrl.ack(d)
                    e = d.event
                    if isinstance(e, PolicyPublished):
                        self._published[e.version] = e.uri
                        if fully and e.version > self.engine.version:
                            self.engine.load_weights(e.version, e.uri)

        self._listener = threading.Thread(target=listen, name="policy-listener", daemon=True)
        self._listener.start()

    def _await_version(self, version: int, timeout_s: float = 600.0) -> None:
        """async: rollouts of update u use theta_{u-1} (one step stale), loaded between updates."""
        deadline = time.time() + timeout_s
        while version not in self._published and self.engine.version < version:
            self._check_learner_alive(f"waiting for policy v{version}")
            if time.time() > deadline:
                raise RunFailed(f"policy v{version} was not published within {timeout_s:.0f}s")
            time.sleep(0.01)
        if self.engine.version < version:
            self.engine.load_weights(version, self._published[version])

    def _flush_pending(self, block: bool) -> None:
        for k in sorted(self._pending):
            barrier = self._collect_spans(k, timeout_s=600.0 if block else 0.0)
            if barrier is None:
                return
            t0, r_end, cb = self._pending.pop(k)
            self._write_metrics(k, t0, r_end, cb, barrier, k + 1, barrier.end)

    def kill_teacher(self) -> None:
        """Fault injection: SIGKILL the teacher server's whole process group mid-update."""
        import signal

        proc = self.teacher_server.proc if self.teacher_server is not None else None
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.rundir.log("fault injection: teacher server killed")

    def _wait_learner_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.time() + timeout_s
        ready = 0
        while time.time() < deadline:
            for d in self.span_sub.receive(timeout_s=0.5):
                self.span_sub.ack(d)
                if isinstance(d.event, Span) and d.event.kind == "ready":
                    ready += 1
                    if ready == len(self.proc.procs):
                        return
            self._check_learner_alive("start-up")
        raise RunFailed(f"the learner process did not start within {timeout_s:.0f}s")

    def _check_learner_alive(self, when: str) -> None:
        if not self.proc.is_alive():
            err = self.rundir.path / "learner-error.txt"
            detail = (
                err.read_text().strip().splitlines()[-1]
                if err.exists()
                else f"exit code {self.proc.exitcode}"
            )
            raise RunFailed(
                f"learner process died during {when}: {detail}; "
                "resume with `tsrl train ... --resume` (needs checkpoint_every > 0)"
            )

    def _wait_published(self, version: int) -> PolicyPublished:
        while True:
            for d in self.ctrl.receive(timeout_s=0.5):
                e = d.event
                self.ctrl.ack(d)
                if isinstance(e, PolicyPublished) and e.version == version:
                    ack = self.engine.load_weights(version, e.uri)
                    self.bus.publish(
                        ReplicaAcked(run_id=self.run_id, replica_id="engine-0", version=ack.version)
                    )
                    return e
            self._check_learner_alive(f"update {version - 1}")

    def _collect_spans(self, k: int, timeout_s: float = 30.0) -> Span | None:
        if k in self._barriers:
            return self._barriers.pop(k)
        deadline = time.time() + timeout_s
        while True:
            batch = self.span_sub.receive(timeout_s=0.2 if timeout_s else 0.001, max_count=1024)
            for d in batch:
                e = d.event
                self.span_sub.ack(d)
                if isinstance(e, Span):
                    self.rundir.spans([e.to_jsonl_record()])
                    if e.role is Role.BARRIER:
                        self._barriers[e.update] = e
            if k in self._barriers:
                return self._barriers.pop(k)
            if time.time() >= deadline and not batch:
                return None


class _LearnerGroup:
    """All learner ranks, supervised as one: the run fails if any rank dies."""

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def is_alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    @property
    def exitcode(self) -> int | None:
        codes = [p.exitcode for p in self.procs if p.exitcode]
        return codes[0] if codes else None

    def join(self, timeout: float | None = None) -> None:
        for p in self.procs:
            p.join(timeout)

    def terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()


def _crashing(task: RolloutTask, after_turns: int) -> RolloutTask:
    """Fault injection: the trajectory's worker dies at its second tool call (after turn 0 was
    already sent to the learner), as a killed rollout worker would."""
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


def load_config_arg(config: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    from tsrl.config import load_run_config

    p = Path(config)
    if p.suffix == ".json" and p.exists():
        return load_run_config(data=json.loads(p.read_text()), overrides=overrides)
    return load_run_config(config, overrides)
