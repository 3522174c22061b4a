from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from thundersync.learner.batch_replay import LoggedBatch, make_grpo_batch, make_opd_batch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def grpo_batch() -> LoggedBatch:
    return make_grpo_batch(
        random.Random(0), vocab=512, groups=3, group_size=4, reward_offset=1000.0
    )


@pytest.fixture
def opd_batch(tiny_teacher_dir: Path) -> LoggedBatch:
    from thundersync.hf_models import load_model

    return make_opd_batch(random.Random(0), load_model(tiny_teacher_dir), vocab=512, trajectories=3)
