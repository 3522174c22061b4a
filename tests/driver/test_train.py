"""End-to-end runs of the driver: learner in its own process, real agent loop, real sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thundersync.config import RunConfig, load_run_config
from thundersync.driver.faults import FaultPlan
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import EXIT_CANCELLED, RunDriver, RunFailed
from thundersync.learner.checkpoint import checkpoint_version
from thundersync.learner.checkpoint_dcp import read_master
from thundersync.rollout.checkpoint import load_state_dict
from thundersync.rundir import RunFiles


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(run_dir: Path, version: int) -> dict[str, torch.Tensor]:
    return load_state_dict(RunFiles(run_dir).weights(version))


def _applied(run_dir: Path) -> list[tuple]:
    """Every source (and GRPO group registration) the learner applied, by update: id, type,
    tokens (a group: its prompt), mask, reward, teacher scores."""
    out = []
    for path in sorted((run_dir / "batches").glob("u*.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            out.append(
                (
                    path.name.split("-")[0],
                    e.get("source_id", e["group_id"]),
                    e["type"],
                    tuple(e.get("token_ids", e.get("prompt_ids", ()))),
                    tuple(e.get("action_mask", ())),
                    e.get("reward"),
                    tuple(e.get("teacher_logprobs", ())),
                )
            )
    return sorted(out)


def _equal_to_sync(run_dir: Path, cfg: RunConfig) -> None:
    """The run's published parameters equal a sync replay of exactly the sources it applied."""
    gaps = replay_gap(run_dir, cfg, run_dir / "model")
    assert len(gaps) == cfg.updates and max(gaps) <= 1e-6, gaps


def _small(recipe: str, **over: object) -> RunConfig:
    base: dict[str, object] = {
        "updates": 2,
        "rollout.groups_per_update": 2,
        "rollout.group_size": 4,
    }
    return load_run_config(recipe, base | over)


def test_grpo_toy_reward_rises(tmp_path: Path) -> None:
    cfg = load_run_config("grpo-toy")
    assert RunDriver(cfg, tmp_path).run() == 0
    rewards = [m["reward_mean"] for m in _metrics(tmp_path)]
    assert len(rewards) == cfg.updates
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.05, rewards
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "succeeded"
    spans = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    roles = {s["role"] for s in spans}
    assert {"rollout", "learner", "barrier"} <= roles
    assert all("ready" in s for s in spans if s["role"] == "learner" and s["kind"] == "work_item")


@pytest.mark.parametrize("recipe", ["grpo-toy", "opd-toy"])
def test_streamed_run_equals_sync_replay_of_its_logged_batches(tmp_path: Path, recipe: str) -> None:
    cfg = _small(recipe)
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0
    gaps = replay_gap(tmp_path, cfg, tmp_path / "model")
    assert len(gaps) == 2 and max(gaps) <= 1e-6, gaps


@pytest.mark.parametrize("recipe", ["grpo-toy", "opd-toy"])
def test_killed_rollout_worker_reruns_and_nothing_partial_reaches_learner(
    tmp_path: Path, recipe: str
) -> None:
    cfg = _small(recipe)
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    assert RunDriver(cfg, clean, log_batches=True).run() == 0
    from thundersync.driver.tasks import plan_update, task_pool

    victim = plan_update(cfg, task_pool(cfg), 1)[1].traj_id
    assert (
        RunDriver(cfg, faulty, log_batches=True, faults=FaultPlan(crash_once={victim})).run() == 0
    )
    assert "rerun #1" in (faulty / "log.txt").read_text()
    # the rerun under theta_k reproduced the trajectory, and the learner applied exactly the
    # clean run's sources: none of the killed attempt's turns reached the update
    clean_src, faulty_src = _applied(clean), _applied(faulty)
    strip = [(u, sid.replace("~a1", ""), *rest) for u, sid, *rest in faulty_src]
    assert sorted(strip) == clean_src
    _equal_to_sync(faulty, cfg)


@pytest.mark.parametrize("ranks", [1, 2])
def test_killed_learner_resumes_from_checkpoint_with_identical_parameters(
    tmp_path: Path, ranks: int
) -> None:
    """2 ranks: each FSDP2 rank writes its own shards and moments (a DCP checkpoint) and reads
    them back; the master is read whole here from those shards."""
    cfg = _small("grpo-toy", updates=3, checkpoint_every=1, **{"learner.ranks": ranks})
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    assert RunDriver(cfg, clean, log_batches=True).run() == 0
    with pytest.raises(RunFailed, match="learner process died"):
        RunDriver(cfg, crashed, log_batches=True, faults=FaultPlan(kill_learner_at_update=2)).run()
    assert json.loads((crashed / "status.json").read_text())["status"] == "failed"
    ckpts = crashed / "checkpoints"
    assert checkpoint_version(ckpts, ranks) == 2
    if ranks == 1:
        params = torch.load(ckpts / "learner-rank0.pt", weights_only=False)["params"]
    else:
        params = read_master(ckpts)
    published = _weights(crashed, 2)  # what the replicas served before the crash
    assert params and params.keys() <= published.keys()
    assert all(torch.equal(params[k], published[k]) for k in params)
    assert RunDriver(cfg, crashed, resume=True, log_batches=True).run() == 0
    assert len(_metrics(crashed)) == 3  # updates 0, 1, then 2 redone after the resume
    assert _applied(crashed) == _applied(clean)
    _equal_to_sync(crashed, cfg)


def test_redis_streams_bus_run_matches_the_embedded_bus(tmp_path: Path) -> None:
    cfg = _small("grpo-toy")
    assert RunDriver(cfg, tmp_path / "proc", log_batches=True).run() == 0
    assert RunDriver(cfg, tmp_path / "redis", bus_kind="redis", log_batches=True).run() == 0
    assert _applied(tmp_path / "proc") == _applied(tmp_path / "redis")
    _equal_to_sync(tmp_path / "redis", cfg)


def test_cancel_stops_the_run_at_a_barrier(tmp_path: Path) -> None:
    cfg = _small("grpo-toy", updates=5)

    def cancel_after_first(rec: dict) -> None:
        (tmp_path / "CANCEL").write_text("")

    assert RunDriver(cfg, tmp_path, progress=cancel_after_first).run() == EXIT_CANCELLED
    assert len(_metrics(tmp_path)) == 1  # the update in flight finished its step; no other began
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "cancelled"


def test_a_source_delivered_twice_is_applied_once(tmp_path: Path) -> None:
    cfg = _small("opd-toy")
    assert RunDriver(cfg, tmp_path / "clean", log_batches=True).run() == 0
    assert (
        RunDriver(
            cfg, tmp_path / "dup", log_batches=True, faults=FaultPlan(duplicate_sources=True)
        ).run()
        == 0
    )
    assert _applied(tmp_path / "dup") == _applied(tmp_path / "clean")
    _equal_to_sync(tmp_path / "dup", cfg)


@pytest.mark.parametrize("schedule", ["async", "fully_async"])
def test_stale_schedules_run_for_comparison_and_report_staleness(
    tmp_path: Path, schedule: str
) -> None:
    cfg = _small("grpo-toy", updates=3, schedule=schedule)
    assert RunDriver(cfg, tmp_path).run() == 0
    metrics = _metrics(tmp_path)
    assert [m["update"] for m in metrics] == [0, 1, 2]
    assert all(m["schedule"] == schedule for m in metrics)
    staleness = [m["max_staleness"] for m in metrics]
    if schedule == "async":
        # rollouts of update k+1 ran on theta_k while the learner stepped: exactly one step stale
        assert max(staleness) == 1
    else:  # fully_async swaps weights whenever they land: how stale depends on timing
        assert all(s >= 0 for s in staleness)


@pytest.mark.parametrize("recipe", ["grpo-toy", "opd-toy"])
def test_two_learner_ranks_with_fsdp2_train_like_sync(tmp_path: Path, recipe: str) -> None:
    cfg = _small(recipe, **{"learner.ranks": 2})
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0
    # each rank applied only its own groups; the barrier's all-reduce joined them
    _equal_to_sync(tmp_path, cfg)
