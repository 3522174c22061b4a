"""GPU placement on one node without Ray: every role's `CUDA_VISIBLE_DEVICES` from one plan.

The pure plan is checked on the paper's 8-GPU splits; then real runs on this CPU machine, whose
driver is handed `CUDA_VISIBLE_DEVICES` as a GPU node's would be (torch's CPU build ignores it),
record the plan in the run directory, and each learner rank records what it was given: the test
compares the two, and the cores the driver kept for itself and its children.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paper_splits import GRPO_PAPER, OPD_PAPER

from thundersync.cluster.local_plan import node_gpu_ids, plan_local
from thundersync.cluster.ray_plan import PlacementError, PlacementRole
from thundersync.config import load_run_config

EIGHT = tuple(str(i) for i in range(8))


def test_paper_splits_give_each_process_its_own_gpus() -> None:
    grpo = plan_local(load_run_config("grpo-toy", GRPO_PAPER), EIGHT)
    assert [(s.role, s.index, s.env["CUDA_VISIBLE_DEVICES"]) for s in grpo.slots] == [
        *[(PlacementRole.LEARNER, r, str(r)) for r in range(4)],
        *[(PlacementRole.ROLLOUT, i, str(4 + i)) for i in range(4)],
    ]
    opd = plan_local(load_run_config("opd-toy", {**OPD_PAPER, "placement.teacher_tp": 2}), EIGHT)
    assert opd.env(PlacementRole.ROLLOUT, 1) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert opd.env(PlacementRole.TEACHER, 0) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert opd.driver_index(PlacementRole.TEACHER) == 6
    tp2 = load_run_config(
        "grpo-toy", {**GRPO_PAPER, "rollout.replicas": 2, "rollout.vllm.tensor_parallel_size": 2}
    )
    assert [s.gpus for s in plan_local(tp2, EIGHT).slots[4:]] == [("4", "5"), ("6", "7")]
    every = [g for s in grpo.slots for g in s.gpus]
    assert sorted(every) == list(EIGHT)  # no GPU handed to two processes


def test_a_driver_given_some_gpus_hands_out_those() -> None:
    ids = node_gpu_ids({"CUDA_VISIBLE_DEVICES": "2, 3,5,7"}, device_count=8)
    assert ids == ("2", "3", "5", "7")
    assert node_gpu_ids({}, device_count=3) == ("0", "1", "2")
    assert node_gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, device_count=8) == ()
    cfg = load_run_config(
        "grpo-toy",
        {"learner.ranks": 2, "placement.learner_gpus": 2, "placement.rollout_gpus": 1},
    )
    plan = plan_local(cfg, ids)
    assert [s.gpus for s in plan.slots] == [("2",), ("3",), ("5",)]
    assert plan.driver_index(PlacementRole.ROLLOUT) == 2  # the driver's cuda:2 is GPU 5


def test_no_gpus_asked_for_shares_the_node_and_too_many_is_refused() -> None:
    shared = plan_local(load_run_config("grpo-toy"), EIGHT)
    assert shared.shared and shared.env(PlacementRole.LEARNER, 0) == {}
    assert "shared by every process" in shared.describe()
    with pytest.raises(PlacementError, match=r"asks for 8 GPUs .* this node offers 4 .*--ray"):
        plan_local(load_run_config("grpo-toy", GRPO_PAPER), EIGHT[:4])


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, object]) -> Path:
    from thundersync.driver.run import RunDriver

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # as a node's scheduler hands out
    base = {"updates": 1, "rollout.groups_per_update": 2, "rollout.group_size": 2}
    cfg = load_run_config("grpo-toy", {**base, **overrides})
    assert RunDriver(cfg, tmp_path).run() == 0
    return tmp_path


def _where(run: Path, name: str) -> dict[str, object]:
    return dict(json.loads((run / "where" / f"{name}.json").read_text()))


def test_learner_ranks_run_on_the_gpus_the_recorded_plan_gives_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = {"learner.ranks": 2, "placement.learner_gpus": 2, "placement.rollout_gpus": 1}
    run = _run(tmp_path, monkeypatch, gpus)
    recorded = json.loads((run / "placement.json").read_text())["gpus"]
    assert recorded["node_gpus"] == ["4", "5", "6", "7"]
    procs = {(p["role"], p["index"]): p["CUDA_VISIBLE_DEVICES"] for p in recorded["processes"]}
    assert procs == {("learner", 0): "4", ("learner", 1): "5", ("rollout", 0): "6"}
    for rank in (0, 1):
        where = _where(run, f"learner-{rank}")
        assert where["CUDA_VISIBLE_DEVICES"] == procs[("learner", rank)]
        assert where["pid"] != os.getpid()
    assert "learner 1 -> GPU 5" in (run / "log.txt").read_text()


def test_a_cpu_learner_keeps_one_core_and_the_driver_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    run = _run(tmp_path, monkeypatch, {})
    cpus = json.loads((run / "placement.json").read_text())["cpus"]
    assert cpus == {"driver": cores[:-1], "learner": cores[-1]}
    assert _where(run, "learner-0")["cpus"] == [cores[-1]]
    assert _where(run, "learner-0")["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # shared: as given
    assert sorted(os.sched_getaffinity(0)) == cores  # the driver gave its cores back


def test_local_vllm_servers_get_their_replicas_gpus(tmp_path: Path) -> None:
    """The driver's local replicas (driver/vllm_replicas.py) start with the plan's env."""
    from dataclasses import replace

    from thundersync.driver.vllm_replicas import local_env
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig

    plan = plan_local(load_run_config("grpo-toy", GRPO_PAPER), EIGHT)
    sc = VLLMServerConfig(model="unused", on_gpu=True)
    envs = [
        VLLMServer(replace(sc, extra_env=local_env(plan, i)), log_dir=tmp_path).env()
        for i in range(4)
    ]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4", "5", "6", "7"]
    assert local_env(None, 0) == {}  # no plan: the server inherits the driver's env


def test_the_paper_presets_fill_the_splits() -> None:
    grpo = load_run_config("grpo-toy", {"placement.preset": "grpo-4x4"})
    assert (grpo.learner.ranks, grpo.rollout.engine, grpo.rollout.replicas) == (4, "vllm", 4)
    assert [s.gpus for s in plan_local(grpo, EIGHT).slots] == [(str(i),) for i in range(8)]
    opd = load_run_config("opd-toy", {"placement.preset": "opd-4x2x2"})
    assert (opd.teacher.backend, opd.placement.teacher_gpus, opd.rollout.replicas) == ("vllm", 2, 2)
    plan = plan_local(opd, EIGHT)
    assert plan.env(PlacementRole.TEACHER, 0) == {"CUDA_VISIBLE_DEVICES": "6"}
    tp2 = load_run_config(
        "grpo-toy", {"placement.preset": "grpo-4x4", "rollout.vllm.tensor_parallel_size": 2}
    )
    assert tp2.rollout.replicas == 2 and tp2.placement.rollout_gpus == 4  # 2 replicas x 2 GPUs


def test_presets_are_checked_by_name() -> None:
    from thundersync.config import ConfigError

    with pytest.raises(ConfigError, match=r"placement.preset 'gpu-party' unknown: use one of"):
        load_run_config("grpo-toy", {"placement.preset": "gpu-party"})
    with pytest.raises(ConfigError, match=r"opd-4x2x2 gives a teacher GPUs: it is for objective"):
        load_run_config("grpo-toy", {"placement.preset": "opd-4x2x2"})
    # a field the config sets wins, and a contradiction is refused naming the fields
    cfg = load_run_config("grpo-toy", {"placement.preset": "grpo-4x4", "learner.ranks": 2})
    with pytest.raises(PlacementError, match=r"placement.learner_gpus=4 with learner.ranks=2"):
        plan_local(cfg, EIGHT)
