"""An OPD run's page in headless Chromium (issue 36): a real opd-toy run (the real `tsrl train`)
shows its KL to the teacher per update in a chart, and the time-to-target card runs on KL (a
default target of half the first update's KL, reached at or below). Screenshot:
out/screenshots/dashboard-opd-run.png."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from service_helpers import ADMIN_TOKEN, make_settings
from test_dashboard_e2e import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, free_port

from thundersync.service.main import create_app
from thundersync.service.settings import default_driver_command


@pytest.fixture
def opd_server(tmp_path: Path) -> Iterator[str]:
    """The real app under uvicorn (SQLite) launching the real run driver."""
    port = free_port()
    settings = make_settings(
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        tmp_path / "data",
        port=port,
        driver_command=default_driver_command(),
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


def test_opd_run_page_shows_kl_per_update(opd_server: str, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run `bash scripts/setup.d/30-service.sh` as root")
    from playwright.sync_api import expect, sync_playwright

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    small = {"updates": 3, "rollout.groups_per_update": 2, "rollout.group_size": 4}
    with httpx.Client(base_url=opd_server, headers=auth, timeout=30) as api:
        res = api.post("/api/v1/runs", json={"recipe": "opd-toy", "overrides": small})
        assert res.status_code == 201, res.text
        run_id = res.json()["id"]
        deadline = time.monotonic() + 300
        while (status := api.get(f"/api/v1/runs/{run_id}").json()["status"]) != "succeeded":
            assert status not in ("failed", "cancelled") and time.monotonic() < deadline, status
            time.sleep(0.2)
        kls = [u["kl_mean"] for u in api.get(f"/api/v1/runs/{run_id}/updates").json()["data"]]
    assert len(kls) == 3 and all(k is not None for k in kls), kls

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1300, "height": 1400},
        )
        try:
            page = context.new_page()
            page.goto(f"{opd_server}/?token={ADMIN_TOKEN}#/runs/{run_id}")
            expect(page.locator("#run-status")).to_have_text("succeeded", timeout=60_000)
            expect(page.locator("#updates-done")).to_have_text("3")
            expect(page.locator("#kl-box")).to_be_visible()
            shown = page.evaluate("() => Chart.getChart('kl-chart').data.datasets[0].data")
            assert shown == kls
            # time to target on KL: the default target is half the first update's KL
            expect(page.locator("#ttt-metric")).to_have_text("KL ≤")
            target = float(page.input_value("#ttt-target"))
            assert target == pytest.approx(kls[0] / 2, rel=0.05)
            axis = page.evaluate("() => Chart.getChart('ttt-chart').options.scales.y.title.text")
            assert axis == "mean token KL to the teacher"
            expect(page.locator("#ttt-title")).to_have_text("KL to the teacher")
            curve = page.evaluate("() => Chart.getChart('ttt-chart').data.datasets[0].data")
            assert [p["y"] for p in curve] == kls
            shot = tmp_path / "dashboard-opd-run.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            context.close()
    assert shot.stat().st_size > 10_000
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / "dashboard-opd-run.png")
