"""Sandbox test fixtures: real backends only (bubblewrap here; podman's socket for docker)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from thundersync.sandbox.executor import SessionSpec
from thundersync.sandbox.local import LocalExecutor, LocalSession


@pytest.fixture(scope="session")
def local_executor() -> LocalExecutor:
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap missing: run `bash scripts/setup.d/20-sandbox.sh` as root")
    return LocalExecutor()


@pytest.fixture
def local_session(local_executor: LocalExecutor) -> Iterator[LocalSession]:
    s = local_executor.open(SessionSpec(label="test"))
    yield s
    s.close()
