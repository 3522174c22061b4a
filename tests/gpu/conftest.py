"""Under tests/gpu a skip is a failure wherever CUDA is present: a GPU check must never pass by
skipping (no CUDA vLLM, a missing package) on the machine it exists for. Without CUDA the
module-level skips stand (these tests only run on a GPU)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import torch


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and torch.cuda.is_available():
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} skipped on a machine with CUDA ({report.longrepr}): a GPU check "
            "may not pass by skipping; install what it needs (e.g. a CUDA vLLM in .venv-vllm)"
        )
