"""Named scores on the run page (issue 35): metrics lines with `score/<name>` keys (what the driver
writes for multi-reward terminal tasks: tests/driver/test_named_scores.py) are served by the
updates API as `scores` and shown, the last update's values, in the run page's scores card; a
run without named scores shows no card. Real app under uvicorn, headless Chromium; the run
directory is written by a stand-in driver through the driver's own writer."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from service_helpers import ADMIN_TOKEN, FAKE_DRIVER, make_settings
from test_dashboard_e2e import CHROMIUM, CHROMIUM_ARGS, free_port

from thundersync.service.main import create_app

DRIVER = """
import json, sys, time
from pathlib import Path
from thundersync.rundir import RunDirWriter, RunStatus

rd = RunDirWriter(Path(sys.argv[sys.argv.index("--run-dir") + 1]))
for k, (correct, tidy) in enumerate([(0.25, 0.0), (0.75, 0.5)]):
    rec = {"update": k, "schedule": "stream", "time": time.time(), "step_s": 0.1,
           "rollout_s": 0.05, "learner_busy_s": 0.03, "barrier_s": 0.01, "idle_share": 0.5,
           "mfu": 0.01, "reward_mean": correct, "tokens": 8}
    rd.write_update(rec | {"score/correct": correct, "score/tidy": tidy})
rd.write_status(RunStatus.SUCCEEDED, "2 updates")
rd.close()
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """Runs named "scores..." use the stand-in above; others the launcher's fake driver."""
    script = tmp_path / "scores_driver.py"
    script.write_text(
        "import runpy, sys\n"
        "cfg = __import__('json').loads(open(sys.argv[1]).read())\n"
        f"if str(cfg.get('name', '')).startswith('scores'):\n    exec({DRIVER!r})\n"
        f"else:\n    sys.argv[0] = {FAKE_DRIVER[1]!r}; runpy.run_path(sys.argv[0], "
        "run_name='__main__')\n"
    )
    port = free_port()
    settings = make_settings(
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        tmp_path / "data",
        port=port,
        driver_command=[sys.executable, str(script)],
    )
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the service did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


def _finished_run(api: httpx.Client, name: str) -> str:
    res = api.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "name": name, "overrides": {"updates": 2}}
    )
    assert res.status_code == 201, res.text
    run_id = str(res.json()["id"])
    deadline = time.monotonic() + 60
    while (status := api.get(f"/api/v1/runs/{run_id}").json()["status"]) != "succeeded":
        assert status not in ("failed", "cancelled") and time.monotonic() < deadline, status
        time.sleep(0.1)
    return run_id


def test_run_page_shows_the_last_named_scores(server: str, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run `bash scripts/setup.d/30-service.sh` as root")
    from playwright.sync_api import expect, sync_playwright

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server, headers=auth, timeout=30) as api:
        scored = _finished_run(api, "scores-run")
        plain = _finished_run(api, "plain-run")
        rows = api.get(f"/api/v1/runs/{scored}/updates").json()["data"]
        assert [r["scores"] for r in rows] == [
            {"correct": 0.25, "tidy": 0.0},
            {"correct": 0.75, "tidy": 0.5},
        ]
        assert all(
            r["scores"] is None for r in api.get(f"/api/v1/runs/{plain}/updates").json()["data"]
        )

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            page = context.new_page()
            page.goto(f"{server}/?token={ADMIN_TOKEN}#/runs/{scored}")
            expect(page.locator("#updates-done")).to_have_text("2", timeout=30_000)
            expect(page.locator("#scores-card")).to_be_visible()
            expect(page.locator("#scores")).to_have_text("correct 0.750 · tidy 0.500")
            page.goto(f"{server}/?token={ADMIN_TOKEN}#/runs/{plain}")
            expect(page.locator("#run-name")).to_have_text("plain-run", timeout=30_000)
            expect(page.locator("#updates-done")).to_have_text("2")
            expect(page.locator("#scores-card")).to_be_hidden()
        finally:
            context.close()
