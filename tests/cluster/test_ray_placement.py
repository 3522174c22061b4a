"""The learner as a Ray actor on a local Ray cluster, over Redis Streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thundersync.config import load_run_config
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import RunDriver


@pytest.mark.parametrize("recipe", ["opd-toy"])  # OPD exercises every role, teacher included
def test_roles_as_ray_actors_on_a_local_cluster_train_like_sync(
    tmp_path: Path, recipe: str
) -> None:
    """Learner, rollout engine, teacher and sandbox environments all run as Ray actors."""
    import ray

    cfg = load_run_config(
        recipe,
        {
            "updates": 2,
            "rollout.groups_per_update": 2,
            "rollout.group_size": 4,
            "learner.accum_dtype": "float64",
        },
    )
    try:
        driver = RunDriver(cfg, tmp_path, bus_kind="redis", ray_address="local", log_batches=True)
        assert driver.run() == 0
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    log = (tmp_path / "log.txt").read_text()
    assert "as Ray actors" in log
    line = next(x for x in log.splitlines() if "teacher: {" in x)
    teacher = json.loads(line.split("teacher: ", 1)[1])
    # the Ray teacher actor keeps each trajectory's K/V: turns after the first are cache hits
    assert teacher["scoring"] == "incremental" and teacher["hits"] > 0, teacher
    assert teacher["open"] == 0, teacher  # every closed trajectory was released
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [0, 1]
    assert max(replay_gap(tmp_path, cfg, tmp_path / "model")) <= 1e-6


def test_vllm_rollout_and_teacher_replicas_as_ray_actors_train_like_sync(tmp_path: Path) -> None:
    """rollout.engine=vllm and teacher.backend=vllm with --ray (one run, two replica actors): each
    replica's server reports its URL; the policy's weights reach its replica through shared
    memory (same host), every OPD turn is scored through the teacher replica, and the run equals a
    sync replay."""
    import ray

    cfg = load_run_config(
        "opd-toy",
        {
            "updates": 2,
            "rollout.groups_per_update": 2,
            "rollout.group_size": 2,
            "rollout.engine": "vllm",
            "teacher.backend": "vllm",
            "learner.accum_dtype": "float64",
        },
    )
    try:
        driver = RunDriver(cfg, tmp_path, bus_kind="redis", ray_address="local", log_batches=True)
        assert driver.run() == 0
    finally:
        ray.shutdown()
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["acked_by"], m["load_method"]) for m in metrics] == [(["engine-0"], "shm")] * 2
    log = (tmp_path / "log.txt").read_text()
    assert "rollout on 1 vLLM replicas" in log
    line = next(x for x in log.splitlines() if "teacher: {" in x)
    teacher = json.loads(line.split("teacher: ", 1)[1])
    assert teacher["scoring"] == "full" and teacher["replicas"] == 1, teacher
    assert teacher["calls"][0] > 0 and teacher["restarts"] == [0], teacher
    assert max(replay_gap(tmp_path, cfg, tmp_path / "model")) <= 1e-6
