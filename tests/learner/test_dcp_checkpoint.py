"""Sharded (DCP) checkpoints of FSDP2 learner ranks: resume after a kill, reshard onto another
number of ranks, and read the whole master without a process group.

Every run here is its own set of gloo processes (spawned, a fresh port each), as a restarted
learner would be. A phase that "dies" is SIGKILLed by the test once every rank has saved, so
nothing but the files on disk reaches the resumed run. Workers put a barrier before
`destroy_process_group` (a rank tearing down while a peer is still in a collective may abort)
and the test joins them under a deadline, naming every rank's exit code when one fails.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from thundersync.config import Schedule, load_run_config
from thundersync.learner.batch_replay import make_grpo_batch
from thundersync.learner.checkpoint_dcp import POINTER, read_master
from thundersync.rollout.vllm_server import free_port

UPDATES, SAVE_AT = 4, 2
DEADLINE_S = 900.0  # a hang guard only: 2 busy cores may be slow, but never this slow


@dataclass
class Job:
    """One run of `world` ranks: train to `stop` (resuming first when `resume`), saving after
    each update in `saves`; after the save at `die_at` every rank waits to be killed. Rank 0
    writes the end state (or the state at `die_at`) to `out`."""

    model_dir: Path
    ckpt: Path
    out: Path
    mode: str  # "learner": replayed GRPO updates; "optimizer": the step on a fixed gradient
    batches: list[Any]
    stop: int = UPDATES
    resume: bool = False
    saves: tuple[int, ...] = ()
    die_at: int | None = None


def _grads(shapes: list[torch.Size], k: int) -> list[torch.Tensor]:
    """Update k's gradient: the same on every rank and in every run (seeded by k)."""
    gen = torch.Generator().manual_seed(1000 + k)
    return [torch.randn(s, generator=gen) for s in shapes]


def _gathered(learner: Any) -> dict[str, Any]:
    """Collective: the whole master, moments and steps (from the shards) and the replica."""
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v.clone())
        for k, v in learner.optimizer.sharded_state().items()
    }
    replica = {n: p.detach().clone() for n, p in zip(learner.names, learner.params, strict=True)}
    return {"state": state, "replica": replica, "version": learner.version}


def _saved_marker(job: Job, rank: int) -> Path:
    return job.out.parent / f"{job.out.name}.saved{rank}"


def _worker(rank: int, world: int, port: int, job_path: Path) -> None:
    import torch.distributed as dist

    from thundersync.hf_models import load_model
    from thundersync.learner.batch_replay import replay_update
    from thundersync.learner.checkpoint import load_checkpoint, save_checkpoint
    from thundersync.learner.parallel import init_process_group
    from thundersync.learner.trainer import Learner

    torch.set_num_threads(1)
    job: Job = pickle.loads(job_path.read_bytes())
    ctx = init_process_group(rank, world, port)
    try:
        cfg = load_run_config(data={"optim": {"lr": 1e-2}, "learner": {"ranks": world}})
        learner = Learner(load_model(job.model_dir), cfg, ctx=ctx)
        if job.resume:
            assert load_checkpoint(learner, job.ckpt) == SAVE_AT
        shapes = [p.shape for p in learner.params]
        while learner.version < job.stop:
            if job.mode == "learner":
                replay_update(learner, job.batches[learner.version], Schedule.STREAM)
            else:  # the optimizer alone: its arithmetic cannot depend on how many ranks summed
                learner.optimizer.step(_grads(shapes, learner.version))
                learner.version += 1
            if learner.version in job.saves:
                save_checkpoint(learner, job.ckpt)
            if learner.version == job.die_at:
                ends = _gathered(learner)
                if rank == 0:
                    torch.save(ends, job.out)
                if rank == world - 1:  # with the process group up: still no collective
                    torch.save(read_master(job.ckpt), job.out.with_suffix(".read"))
                _saved_marker(job, rank).touch()
                time.sleep(DEADLINE_S)  # the test SIGKILLs this process here
                os._exit(3)
        ends = _gathered(learner)
        if rank == 0:
            torch.save(ends, job.out)
        dist.barrier()  # no rank tears down while a peer may still be in a collective
    finally:
        dist.destroy_process_group()


def _run(world: int, job: Job) -> dict[str, Any]:
    """Start `world` ranks on a free port and wait for them: all exit 0, or (`die_at`) all save
    and are then SIGKILLed. A failed rank kills the rest at once; the exit codes are named.
    Returns what rank 0 wrote."""
    import multiprocessing as mp

    job_path = job.out.with_suffix(".job")
    job_path.write_bytes(pickle.dumps(job))
    spawn = mp.get_context("spawn")
    port = free_port()
    procs = [spawn.Process(target=_worker, args=(r, world, port, job_path)) for r in range(world)]
    for p in procs:
        p.start()
    dies = job.die_at is not None
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            codes = [p.exitcode for p in procs]
            if any(c not in (None, 0) for c in codes):
                break  # a rank failed: its peers would wait in a collective until the deadline
            if dies and all(_saved_marker(job, r).exists() for r in range(world)):
                for p in procs:
                    p.kill()  # the learner dies right after its checkpoint: only files remain
                break
            if not dies and all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
    codes = [p.exitcode for p in procs]
    want = -signal.SIGKILL if dies else 0
    assert codes == [want] * world, f"rank exit codes {codes}, want {want} for each"
    ends: dict[str, Any] = torch.load(job.out, weights_only=False)
    return ends


def _differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The keys whose tensors differ in any bit, dtype or shape."""
    assert a.keys() == b.keys()
    return [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]


def _prepare(mode: str, model_dir: Path, root: Path) -> dict[str, Any]:
    """The uninterrupted 2-rank run, and a 2-rank run SIGKILLed after saving at SAVE_AT."""
    rng = random.Random(5)
    batches = [
        make_grpo_batch(rng, vocab=512, groups=2, group_size=4, tag=f"u{k}") for k in range(UPDATES)
    ]
    every = root / "every"  # the straight run saves after every update (it must not perturb)
    for stale in ("learner-dcp-v0", "learner-dcp-v7"):  # an old save, a killed later one
        (every / stale).mkdir(parents=True)
        (every / stale / "__0_0.distcp").write_bytes(b"junk")
    saves = tuple(range(1, UPDATES + 1))
    straight = Job(model_dir, every, root / "straight.pt", mode, batches, saves=saves)
    ckpt = root / "checkpoints"
    job = Job(model_dir, ckpt, root / "killed.pt", mode, batches, saves=(SAVE_AT,), die_at=SAVE_AT)
    return {"straight": _run(2, straight), "every": every, "killed": _run(2, job), "job": job}


@pytest.fixture(scope="module")
def learner_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _prepare("learner", tiny_model_dir, tmp_path_factory.mktemp("dcp-learner"))


@pytest.fixture(scope="module")
def optimizer_runs(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return _prepare("optimizer", tiny_model_dir, tmp_path_factory.mktemp("dcp-optimizer"))


def _resume(runs: dict[str, Any], world: int, name: str) -> dict[str, Any]:
    killed: Job = runs["job"]
    out = killed.out.parent / f"{name}.pt"
    job = Job(killed.model_dir, killed.ckpt, out, killed.mode, killed.batches, resume=True)
    return _run(world, job)


def test_killed_two_rank_learner_resumes_from_dcp_checkpoint_bit_identically(
    learner_runs: dict[str, Any],
) -> None:
    """2 FSDP2 ranks train 2 of 4 GRPO updates, save (DCP) and are killed; 2 fresh ranks load
    and train the rest: the master shards, AdamW moments and steps, and the compute replica
    are bit for bit those of the uninterrupted 2-rank run."""
    straight = learner_runs["straight"]
    resumed = _resume(learner_runs, 2, "resumed-2")
    assert resumed["version"] == straight["version"] == UPDATES
    assert not _differ(resumed["state"], straight["state"])
    assert not _differ(resumed["replica"], straight["replica"])


def test_two_rank_dcp_checkpoint_resumed_on_three_ranks_matches_the_two_rank_run(
    optimizer_runs: dict[str, Any],
) -> None:
    """Reshard: saved by 2 ranks, loaded by 3 (DCP maps each shard by its global offsets); the
    same per-update gradients then give the uninterrupted 2-rank master and moments bit for bit
    (AdamW is elementwise, so the sharding cannot change a value)."""
    straight = optimizer_runs["straight"]
    resumed = _resume(optimizer_runs, 3, "resumed-3")
    assert resumed["version"] == straight["version"] == UPDATES
    assert not _differ(resumed["state"], straight["state"])
    assert not _differ(resumed["replica"], straight["replica"])


def test_read_master_without_process_group_is_the_gathered_master(
    learner_runs: dict[str, Any],
) -> None:
    """`read_master` (one process, no collectives) returns the fp32 master the killed ranks
    gathered from their shards at the save, here and in a rank with its process group up; the
    pointer names the one checkpoint directory."""
    killed, job = learner_runs["killed"], learner_runs["job"]
    gathered = {
        k.removeprefix("master/"): v for k, v in killed["state"].items() if k.startswith("master/")
    }
    assert {m.dtype for m in gathered.values()} == {torch.float32}
    assert not _differ(read_master(job.ckpt), gathered)
    assert not _differ(torch.load(job.out.with_suffix(".read")), gathered)
    assert json.loads((job.ckpt / POINTER).read_text()) == {"version": 2, "dir": "learner-dcp-v2"}
    assert sorted(p.name for p in job.ckpt.glob("learner-dcp-v*")) == ["learner-dcp-v2"]


def test_each_save_moves_the_pointer_and_prunes_older_and_half_written_dirs(
    optimizer_runs: dict[str, Any],
) -> None:
    """Saving after every update keeps only the newest directory (keep 1, as the one-file
    checkpoint is overwritten): older saves and a newer half-written one (a killed save's, with
    no pointer to it) are removed, and the pointer names the last save, whose master is the run's."""
    every, straight = optimizer_runs["every"], optimizer_runs["straight"]
    assert json.loads((every / POINTER).read_text()) == {"version": 4, "dir": "learner-dcp-v4"}
    assert sorted(p.name for p in every.iterdir()) == ["learner-dcp-v4", POINTER]
    master = {k: v for k, v in straight["state"].items() if k.startswith("master/")}
    assert not _differ({f"master/{k}": v for k, v in read_master(every).items()}, master)
