"""GPU placement on Ray: the pure plan, and the plan on a two-node CPU cluster with fake GPUs.

The cluster (two raylets, 4 advertised GPUs each, nothing real behind them) checks that every
role lands in the bundle the config asks for, that an over-subscription fails before any actor
starts, that vLLM replica actors report their node's URL, and that a GRPO run trains on the CPU
with its learner ranks holding (fake) GPU ids.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paper_splits import GRPO_PAPER, OPD_PAPER

from thundersync.cluster.ray_plan import (
    NodeResources,
    PlacementError,
    PlacementRole,
    plan_placement,
)
from thundersync.config import ConfigError, PlacementStrategy, load_run_config


def node(gpus: float, cpus: float = 16, i: int = 0) -> NodeResources:
    return NodeResources(f"n{i}", f"10.0.0.{i}", gpus, cpus)


def test_paper_layouts_get_one_bundle_per_rank_and_replica() -> None:
    plan = plan_placement(load_run_config("grpo-toy", GRPO_PAPER), [node(8)])
    assert [(s.role, s.index, s.bundle, s.gpus) for s in plan.slots] == [
        *[(PlacementRole.LEARNER, r, r, 1) for r in range(4)],
        *[(PlacementRole.ROLLOUT, i, 4 + i, 1) for i in range(4)],
    ]
    assert plan.bundles[0] == {"GPU": 1.0, "CPU": 1.0} and plan.bundles[4] == {"GPU": 1.0}
    opd = plan_placement(
        load_run_config("opd-toy", {**OPD_PAPER, "placement.teacher_tp": 2}), [node(8)]
    )
    assert [(s.role.value, s.gpus) for s in opd.slots[4:]] == [
        ("rollout", 1),
        ("rollout", 1),
        ("teacher", 2),
    ]
    assert "teacher 1 replica(s) x 2 GPU (bundles 6)" in opd.describe()
    tp = load_run_config(
        "grpo-toy", {**GRPO_PAPER, "rollout.replicas": 2, "rollout.vllm.tensor_parallel_size": 2}
    )
    assert [
        s.gpus for s in plan_placement(tp, [node(4), node(4, i=1)]).of(PlacementRole.ROLLOUT)
    ] == [2, 2]


def test_cpu_only_config_plans_nothing() -> None:
    plan = plan_placement(load_run_config("opd-toy"), [])  # no GPU asked: no cluster needed
    assert not plan.enabled and plan.bundles == []


@pytest.mark.parametrize(
    ("overrides", "nodes", "message"),
    [
        (
            {**OPD_PAPER, "placement.teacher_gpus": 6},
            [node(4), node(4, i=1)],
            r"asks for 12 GPUs \(learner_gpus=4 \+ rollout_gpus=2 \+ teacher_gpus=6\) but the "
            r"cluster offers 8 \(2 node\(s\) with 4 \+ 4 GPUs\)",
        ),
        (GRPO_PAPER, [node(0)], "cluster offers 0"),
        (
            {**GRPO_PAPER, "rollout.replicas": 1, "rollout.vllm.tensor_parallel_size": 4},
            [node(2, i=i) for i in range(4)],
            r"needs 4 GPUs on one node but a node offers at most 2 .*"
            r"lower rollout.vllm.tensor_parallel_size",
        ),
        (
            {**GRPO_PAPER, "placement.gpus_per_node": 8},
            [node(4)],
            "gpus_per_node=8 but the largest",
        ),
        ({**GRPO_PAPER, "placement.gpus_per_node": 2}, [node(4), node(4, i=1)], "offers 4"),
        (
            {**GRPO_PAPER, "placement.strategy": "strict_pack"},
            [node(4), node(4, i=1)],
            "STRICT_PACK",
        ),
        ({**GRPO_PAPER, "placement.strategy": "STRICT_SPREAD"}, [node(8)], "STRICT_SPREAD"),
        (
            {"placement.learner_gpus": 2},
            [node(8)],
            r"placement.learner_gpus=2 with learner.ranks=1",
        ),
        (
            {**GRPO_PAPER, "placement.rollout_gpus": 3},
            [node(8)],
            r"rollout.replicas x tensor-parallel size = 4 x 1 = 4: set placement.rollout_gpus to 4",
        ),
        ({"placement.rollout_gpus": 2}, [node(8)], r"rollout.engine hf: one GPU per replica"),
        ({"placement.teacher_gpus": 1}, [node(8)], "objective grpo has no teacher"),
    ],
)
def test_impossible_placements_name_the_field_and_what_the_cluster_has(
    overrides: dict[str, Any], nodes: list[NodeResources], message: str
) -> None:
    recipe = "opd-toy" if "teacher.backend" in overrides else "grpo-toy"
    with pytest.raises(PlacementError, match=message):
        plan_placement(load_run_config(recipe, overrides), nodes)


def test_placement_section_is_validated_at_load() -> None:
    cfg = load_run_config("grpo-toy", {"placement.strategy": "spread"})
    assert cfg.placement.strategy is PlacementStrategy.SPREAD
    with pytest.raises(
        ConfigError, match=r"placement.teacher_gpus=3 does not split .* teacher_tp=2"
    ):
        load_run_config("opd-toy", {"placement.teacher_gpus": 3, "placement.teacher_tp": 2})
    with pytest.raises(ConfigError, match=r"placement.strategy"):
        load_run_config("grpo-toy", {"placement.strategy": "anywhere"})


# ---- on a two-node Ray cluster advertising fake GPUs --------------------------------------------
class _Probe:
    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Head + one worker raylet, 4 fake GPUs each, on their own ports and temp dir; never
    written to /tmp/ray/ray_current_cluster, where other sessions' `ray.init()` would find it."""
    import ray
    import ray._private.utils as ray_utils
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    mp = pytest.MonkeyPatch()
    mp.setattr(ray_utils, "write_ray_address", lambda *a, **k: None)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers can't import tests/
    temp = tempfile.mkdtemp(prefix="tsrl-ray-", dir="/tmp")  # short: socket paths have a limit
    args = {"num_cpus": 6, "num_gpus": 4, "temp_dir": temp, "include_dashboard": False}
    c = Cluster(initialize_head=True, head_node_args=args)
    try:
        c.add_node(num_cpus=6, num_gpus=4, temp_dir=temp)
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        mp.undo()
        shutil.rmtree(temp, ignore_errors=True)


def test_every_role_lands_in_its_bundle_on_distinct_gpus(cluster: Any) -> None:
    import ray

    from thundersync.cluster.ray_pg import actor_options, place, release

    cfg = load_run_config("opd-toy", OPD_PAPER)  # 4 + 2 + 2 = the cluster's 8 GPUs
    placement = place(cfg)
    try:
        assert placement is not None
        probe: Any = ray.remote(_Probe)
        slots = placement.plan.slots
        actors = [probe.options(**actor_options(s.role, s.index)).remote() for s in slots]
        wheres = ray.get([a.where.remote() for a in actors], timeout=60)
        nodes = placement.bundle_nodes()
        used = set()
        for s, w in zip(slots, wheres, strict=True):
            assert w["node_id"] == nodes[s.bundle], f"{s} ran off its bundle"
            assert len(w["gpu_ids"]) == s.gpus
            used |= {(w["node_id"], g) for g in w["gpu_ids"]}
        assert len(used) == 8  # no GPU handed to two roles
    finally:
        release()


def test_over_subscription_fails_before_any_actor_or_group(cluster: Any) -> None:
    from ray.util import placement_group_table

    from thundersync.cluster.ray_pg import active_placement, place

    before = len(placement_group_table())
    cfg = load_run_config("opd-toy", {**OPD_PAPER, "placement.teacher_gpus": 4})
    with pytest.raises(
        PlacementError, match=r"asks for 10 GPUs .* offers 8 \(2 node\(s\) with 4 \+ 4"
    ):
        place(cfg)
    assert active_placement() is None and len(placement_group_table()) == before


FAKE_VLLM = """#!{python}
import argparse, http.server
p = argparse.ArgumentParser()
p.add_argument("--host"); p.add_argument("--port", type=int)
a, _ = p.parse_known_args()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


def test_vllm_replicas_report_their_node_urls(cluster: Any, tmp_path: Path) -> None:
    import httpx
    import ray

    from thundersync.cluster.ray_pg import place, release
    from thundersync.cluster.ray_servers import remote_servers, start_vllm_replicas, stop_replicas
    from thundersync.rollout.vllm_server import VLLMServerConfig

    fake = tmp_path / "fake-vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    tp = {
        "rollout.replicas": 2,
        "rollout.vllm.tensor_parallel_size": 2,
        "placement.rollout_gpus": 4,
    }
    place(load_run_config("grpo-toy", {"rollout.engine": "vllm", **tp}))
    actors: list[Any] = []
    try:
        cfg = VLLMServerConfig(model="unused", start_timeout_s=30, tensor_parallel_size=2)
        env = {"TSRL_VLLM_PYTHON": str(fake)}
        actors = start_vllm_replicas(PlacementRole.ROLLOUT, cfg, tmp_path / "logs", env=env)
        servers = remote_servers(actors, cfg, timeout_s=60)  # what VLLMEngine(server) drives
        urls = [s.url for s in servers]
        wheres = ray.get([a.where.remote() for a in actors])
        assert len(urls) == 2 and len(set(urls)) == 2
        for url, w in zip(urls, wheres, strict=True):
            assert url.startswith(f"http://{w['ip']}:") and len(w["gpu_ids"]) == 2
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        servers[0].restart("v1")
        assert servers[0].url == urls[0] and servers[0].model == "v1" and servers[0].is_healthy()
        assert servers[1].log_path.name.startswith("vllm-")
    finally:
        if actors:
            stop_replicas(actors)
        release()


def test_grpo_run_trains_on_cpu_with_learner_ranks_on_fake_gpus(
    cluster: Any, tmp_path: Path
) -> None:
    import ray

    from thundersync.cluster.ray_pg import active_placement
    from thundersync.driver.run import RunDriver

    cfg = load_run_config(
        "grpo-toy",
        {
            "updates": 2,
            "rollout.groups_per_update": 2,
            "rollout.group_size": 2,
            "learner.ranks": 2,
            "placement.learner_gpus": 2,
            "placement.rollout_gpus": 1,
        },
    )
    driver = RunDriver(cfg, tmp_path, bus_kind="redis", ray_address=cluster.address)
    assert driver.run() == 0
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [0, 1]
    learners = ray.get([h.where_ref for h in driver.learners.procs])
    assert driver.parts is not None
    engine = ray.get(driver.parts.engine.where_ref)
    for w in [*learners, engine]:
        assert len(w["gpu_ids"]) == 1 and w["resources"]["GPU"] == 1.0
        assert not w["cuda_available"]  # a fake GPU id: the ranks computed on the CPU
    gpus = {(w["node_id"], w["gpu_ids"][0]) for w in [*learners, engine]}
    assert len(gpus) == 3
    assert active_placement() is None  # given back at the run's end


def test_learner_and_rollout_on_two_nodes_publish_by_disk_with_replay_gap_zero(
    cluster: Any, tmp_path: Path
) -> None:
    """STRICT_SPREAD puts the learner rank and the rollout replica on different nodes: the
    transport follows the placement (no shared memory across nodes: an HF engine reads the
    disk checkpoint on the shared run dir), every actor carries the NCCL env, the ranks
    rendezvous at rank 0's node, and the run replays to the same weights as sync training."""
    import ray

    from thundersync.driver.replay_gap import replay_gap
    from thundersync.driver.run import RunDriver

    cfg = load_run_config(
        "grpo-toy",
        {
            "updates": 2,
            "rollout.groups_per_update": 2,
            "rollout.group_size": 2,
            "record_batches": True,
            "placement.learner_gpus": 1,
            "placement.rollout_gpus": 1,
            "placement.strategy": "STRICT_SPREAD",
            "placement.actor_env": {"NCCL_SOCKET_IFNAME": "lo"},
        },
    )
    driver = RunDriver(cfg, tmp_path, bus_kind="redis", ray_address=cluster.address)
    assert driver.run() == 0
    slots = json.loads((tmp_path / "placement.json").read_text())["ray"]["slots"]
    nodes = {s["role"]: s["node_id"] for s in slots}
    assert nodes["learner"] != nodes["rollout"]
    assert json.loads((tmp_path / "config.json").read_text())["publish"]["transport"] == "disk"
    assert "publish: disk (rollout replicas on other nodes" in (tmp_path / "log.txt").read_text()
    (learner,) = ray.get([h.where_ref for h in driver.learners.procs])
    assert driver.parts is not None
    engine = ray.get(driver.parts.engine.where_ref)
    assert (learner["node_id"], engine["node_id"]) == (nodes["learner"], nodes["rollout"])
    for w in (learner, engine):
        assert w["nccl_env"]["NCCL_SOCKET_IFNAME"] == "lo"
        assert w["nccl_env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert replay_gap(tmp_path, driver.cfg, tmp_path / "model") == [0.0, 0.0]


def test_shared_memory_across_nodes_is_refused_before_any_actor(cluster: Any) -> None:
    from thundersync.cluster.ray_learners import prepare_ray_run
    from thundersync.cluster.ray_pg import active_placement, release

    cfg = load_run_config(
        "grpo-toy",
        {
            "publish.transport": "shm",
            "placement.learner_gpus": 1,
            "placement.rollout_gpus": 1,
            "placement.strategy": "STRICT_SPREAD",
        },
    )
    try:
        with pytest.raises(PlacementError, match=r"publish.transport=shm .* other nodes"):
            prepare_ray_run(cfg, cluster.address)
    finally:
        release()
    assert active_placement() is None


def test_a_rank_error_reaches_the_driver_over_ray(cluster: Any, tmp_path: Path) -> None:
    """The rank's exception comes back through Ray: the driver reads no file of the rank's
    node (here its run dir cannot even be created)."""
    from thundersync.bus.factory import BusKind, BusRef
    from thundersync.cluster.placement import LearnerGroup, RunFailed
    from thundersync.cluster.ray_learners import RayLearnerHandle
    from thundersync.rundir import RunFiles
    from thundersync.worker.learner_proc import LearnerSpec

    cfg = load_run_config("grpo-toy")
    spec = LearnerSpec(cfg.model_dump_json(), "/nonexistent-model", "/proc/tsrl-nowhere", "r")
    handle = RayLearnerHandle(spec, BusRef(BusKind.REDIS, "tsrl-test-rank-error"), "unused")
    group = LearnerGroup([handle], RunFiles(tmp_path))
    handle.join(120)
    with pytest.raises(RunFailed, match=r"(?s)rank 0: .*tsrl-nowhere"):
        group.check_alive("start-up")
