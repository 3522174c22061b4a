"""A cancel is never lost to a racing start: the launcher claims a queued run with a
compare-and-set before it starts anything, so whichever commits first wins and the other sees it.
Raced many times on both databases, with the driver start held open across the cancel (the old
read-then-write launcher overwrote that cancel with `starting` and the run trained to the end)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, FAKE_DRIVER, bearer, make_settings, wait_final

from thundersync.service.launcher.backends import EmbeddedBackend, Handle
from thundersync.service.main import create_app


class HeldStart(EmbeddedBackend):
    """The real embedded backend, whose start can be held until the test has cancelled."""

    def __init__(self) -> None:
        super().__init__(FAKE_DRIVER)
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.started: list[str] = []

    def start(self, run_id: str, config_path: Path, run_dir: Path) -> Handle:
        self.started.append(run_id)
        if self.hold:
            self.entered.set()
            assert self.release.wait(30), "the test never released the start"
        return super().start(run_id, config_path, run_dir)


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """One busy process per core: the launcher's start slows down as on a loaded machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def _submit(client: TestClient, h: dict[str, str], name: str) -> str:
    res = client.post(
        "/api/v1/runs",
        json={"recipe": "grpo-toy", "name": name, "overrides": {"updates": 50}},
        headers=h,
    )
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


def _cancel(client: TestClient, run_id: str, h: dict[str, str]) -> dict[str, object]:
    res = client.post(f"/api/v1/runs/{run_id}/cancel", headers=h)
    assert res.status_code == 200, res.text
    return wait_final(client, run_id, h)


def test_cancel_during_a_held_start_wins(database_url: str, tmp_path: Path) -> None:
    backend = HeldStart()
    backend.hold = True
    settings = make_settings(database_url, tmp_path / "data", poll_interval_s=0.02)
    h = bearer(ADMIN_TOKEN)
    with TestClient(create_app(settings, backend=backend)) as client:
        for i in range(4):
            backend.entered.clear()
            backend.release.clear()
            run_id = _submit(client, h, f"slow-held-{i}")
            assert backend.entered.wait(30), "the launcher never started the run"
            seen = client.get(f"/api/v1/runs/{run_id}", headers=h).json()
            assert seen["status"] == "starting"  # claimed and committed before the start
            res = client.post(f"/api/v1/runs/{run_id}/cancel", headers=h)
            assert res.status_code == 200 and res.json()["cancel_requested"] is True
            backend.release.set()
            final = wait_final(client, run_id, h)
            assert final["status"] == "cancelled", final
            assert "cancelled after update" in str(final["reason"])  # the driver saw DIR/CANCEL


def test_cancel_races_the_launcher_under_load(
    database_url: str, tmp_path: Path, cpu_load: None
) -> None:
    """Cancel right after submitting, while the launcher polls without pause: either the cancel
    wins the claim (no driver ever starts) or the launcher does (the driver stops at a barrier)."""
    backend = HeldStart()
    settings = make_settings(database_url, tmp_path / "data", poll_interval_s=0.0)
    h = bearer(ADMIN_TOKEN)
    with TestClient(create_app(settings, backend=backend)) as client:
        for i in range(15):
            run_id = _submit(client, h, f"slow-race-{i}")
            final = _cancel(client, run_id, h)
            assert final["status"] == "cancelled", final
            if final["reason"] == "cancelled before it started":
                assert run_id not in backend.started
            else:
                assert run_id in backend.started and "cancelled after update" in final["reason"]
