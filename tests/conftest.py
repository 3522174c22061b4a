"""Shared fixtures: the tiny model is built once per test run (no hub access on these machines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
