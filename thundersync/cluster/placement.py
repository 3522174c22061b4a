"""Where the learner ranks run (local processes or Ray actors), and whether they are alive.

Embedded: each rank is a spawned process; with one CPU rank it is pinned to its own core and the
rollout side (this process: agent loop, engine, sandboxes' clients) to the others, so that
backward passes overlap with generation instead of sharing a core. On GPUs each rank gets its
`CUDA_VISIBLE_DEVICES` from the local plan (cluster/local_plan.py). With `--ray ADDRESS` each rank is a Ray
actor reached over the broker. Either way the ranks are supervised as one: if any dies, the run
fails with the rank's error and the way to resume.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from thundersync.bus.events import LearnerReady
from thundersync.bus.factory import BusRef
from thundersync.bus.protocol import Bus, Subscription
from thundersync.cluster.local_plan import ENV, LocalPlan, node_gpu_ids, plan_local
from thundersync.cluster.ray_plan import PlacementRole
from thundersync.config import Device, RunConfig
from thundersync.rollout.vllm_server import free_port
from thundersync.rundir import RunFiles
from thundersync.worker.learner_proc import LearnerSpec, learner_main

if TYPE_CHECKING:
    from thundersync.cluster.ray_pg import RayPlacement


class RunFailed(RuntimeError):
    pass


def core_split(learner_on_cpu: bool) -> tuple[set[int] | None, int | None]:
    """(the rollout side's cores, the learner's core): a CPU learner gets the last core to
    itself and the driver every other one, so that what the driver starts (vLLM servers,
    sandboxes) inherits all but the learner's core, never a single core. A GPU learner pins
    nothing (its host work wants threads, issue 33); nor do fewer than two cores."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not learner_on_cpu or len(cpus) < 2:
        return None, None
    return set(cpus[:-1]), cpus[-1]


@dataclass(frozen=True)
class NodePlacement:
    """Where this node's processes run: GPUs per role (None on Ray: its plan places them) and
    the driver's / the learner's cores."""

    gpus: LocalPlan | None
    driver_cpus: set[int] | None
    learner_cpu: int | None

    def describe(self) -> list[str]:
        lines = ["placement: no core pinning"]
        if self.driver_cpus:
            driver = sorted(self.driver_cpus)
            lines = [f"placement: driver on cpus {driver}, learner on cpu {self.learner_cpu}"]
        return [*lines, *([self.gpus.describe()] if self.gpus else [])]

    def to_json(self) -> dict[str, Any]:
        cpus = sorted(self.driver_cpus) if self.driver_cpus else None
        return {
            "cpus": {"driver": cpus, "learner": self.learner_cpu},
            "gpus": self.gpus.to_json() if self.gpus else None,
        }


def place_on_node(cfg: RunConfig, *, on_ray: bool) -> NodePlacement:
    """The local plan of a run without Ray (`PlacementError` before anything starts when the
    node lacks the GPUs); on Ray only the driver's cores are left alone."""
    import torch

    if on_ray:
        return NodePlacement(None, None, None)
    plan = plan_local(cfg, node_gpu_ids(os.environ, torch.cuda.device_count()))
    device = Device(cfg.learner.device)
    gpu = device is Device.CUDA or (device is Device.AUTO and torch.cuda.is_available())
    driver_cpus, learner_cpu = core_split(learner_on_cpu=not gpu)
    return NodePlacement(plan, driver_cpus, learner_cpu)


class RankProcess(Protocol):
    """One learner rank: a spawned `multiprocessing.Process` or a `RayLearnerHandle`."""

    @property
    def exitcode(self) -> int | None: ...

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...


def _error(proc: RankProcess) -> str | None:
    """A Ray rank's exception (it reaches the driver over Ray); a local one writes a file."""
    return getattr(proc, "error", None)


class LearnerGroup:
    """All learner ranks, supervised as one: the run fails if any rank dies."""

    def __init__(
        self, procs: list[RankProcess], files: RunFiles, placement: RayPlacement | None = None
    ) -> None:
        self.procs = procs
        self.files = files
        self.placement = placement  # the run's GPU bundles (Ray), or None

    @classmethod
    def start(
        cls,
        spec: LearnerSpec,
        bus: Bus | BusRef,
        *,
        world: int,
        ray_address: str | None,
        gpus: LocalPlan | None = None,
    ) -> LearnerGroup:
        port = free_port() if world > 1 else 0
        specs = [replace(spec, rank=r, world=world, port=port) for r in range(world)]
        if gpus is not None and ray_address is None:  # each local rank sees only its GPU
            env = [gpus.env(PlacementRole.LEARNER, r).get(ENV) for r in range(world)]
            specs = [replace(sp, cuda_devices=e) for sp, e in zip(specs, env, strict=True)]
        if world > 1 or ray_address is not None:  # ranks share the learner core(s)
            specs = [replace(sp, cpu=None) for sp in specs]
        procs: list[RankProcess]
        placement: RayPlacement | None = None
        if ray_address is not None:  # GPU bundles from cfg.placement; rendezvous at rank 0's node
            from thundersync.cluster.ray_learners import start_ray_learners

            assert isinstance(bus, BusRef), "Ray placement reaches the bus through a broker"
            handles, placement = start_ray_learners(specs, bus, ray_address)
            procs = list[RankProcess](handles)
        else:  # Ray actors die with their owner (this driver); local processes need to be told
            ctx = mp.get_context("spawn")
            specs = [replace(sp, parent_pid=os.getpid()) for sp in specs]
            procs = [ctx.Process(target=learner_main, args=(sp, bus), daemon=True) for sp in specs]
        for p in procs:
            p.start()
        return cls(procs, RunFiles(spec.run_dir), placement)

    def is_alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    @property
    def exitcode(self) -> int | None:
        codes = [p.exitcode for p in self.procs if p.exitcode]
        return codes[0] if codes else None

    def check_alive(self, when: str) -> None:
        if self.is_alive():
            return
        over_ray = [f"rank {i}: {e}" for i, p in enumerate(self.procs) if (e := _error(p))]
        detail = (
            "; ".join(over_ray)
            or self.files.learner_error_detail(len(self.procs))
            or f"exit code {self.exitcode}"
        )
        raise RunFailed(
            f"learner process died during {when}: {detail}; "
            "resume with `tsrl train ... --resume` (needs checkpoint_every > 0)"
        )

    def wait_ready(self, sub: Subscription, timeout_s: float = 300.0) -> None:
        """Until every rank said `LearnerReady` (it loaded theta_k and listens)."""
        deadline = time.time() + timeout_s
        ready: set[int] = set()
        while time.time() < deadline:
            for d in sub.receive(timeout_s=0.5):
                sub.ack(d)
                if isinstance(d.event, LearnerReady):
                    ready.add(d.event.rank)
            if len(ready) == len(self.procs):
                return
            self.check_alive("start-up")
        raise RunFailed(f"the learner did not start within {timeout_s:.0f}s")

    def kill(self) -> None:
        """SIGKILL every local rank (fault injection: a learner dying mid-update)."""
        for p in self.procs:
            pid = getattr(p, "pid", None)  # a Ray rank has none: it is not local
            if pid is not None and p.is_alive():
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            p.join(10)

    def stop(self, *, finished: bool) -> None:
        """A finished learner exits by itself after its last barrier; after a cancel or a failure
        it waits for an update that will never come, so it is stopped (it is idle between
        barriers: no optimizer step is cut short)."""
        for p in self.procs:
            p.join(30 if finished else 0.5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(10)
        if self.placement is not None:  # after the engines (closed first by the driver)
            from thundersync.cluster.ray_pg import release

            release()
            self.placement = None
