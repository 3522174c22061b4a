"""End to end in headless Chromium (Debian `chromium` driven by Playwright, no downloads): a run
submitted through the API shows up on the dashboard, its page updates live over SSE until the run
succeeds, and a screenshot is saved (out/screenshots/dashboard-run.png)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from service_helpers import ADMIN_TOKEN, make_settings

from thundersync.service.main import create_app

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """The real app under uvicorn on a free port (SQLite, the stand-in driver)."""
    port = free_port()
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data", port=port)
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the service did not start")
        time.sleep(0.05)
    yield base
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run `bash scripts/setup.d/30-service.sh` as root")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1300, "height": 1250},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def test_submitted_run_updates_live_on_its_page(
    server: str, browser_page: object, tmp_path: Path
) -> None:
    from playwright.sync_api import Page, expect

    page: Page = browser_page  # type: ignore[assignment]
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server, headers=auth, timeout=30) as api:
        baseline = api.post(
            "/api/v1/runs",
            json={
                "recipe": "grpo-toy",
                "name": "sync-baseline",
                "overrides": {"updates": 6, "schedule": "sync"},
            },
        ).json()
        while api.get(f"/api/v1/runs/{baseline['id']}").json()["status"] != "succeeded":
            time.sleep(0.1)
        run = api.post(
            "/api/v1/runs",
            json={"recipe": "grpo-toy", "name": "slow-stream", "overrides": {"updates": 6}},
        ).json()
        assert run["status"] == "queued"

        # the runs list: token from the URL fragment, then the run rows
        page.goto(f"{server}/#token={ADMIN_TOKEN}")
        expect(page.locator("#whoami")).to_contain_text("admin")
        assert "token" not in page.url  # moved into localStorage, out of the address bar
        row = page.locator(f"tr.run-row[data-id='{run['id']}']")
        expect(row).to_contain_text("slow-stream")

        # the run page follows the run live
        row.click()
        expect(page.locator("#run-name")).to_have_text("slow-stream")
        expect(page.locator("#run-status")).to_have_text("succeeded", timeout=60_000)
        expect(page.locator("#updates-done")).to_have_text("6")
        expect(page.locator("#run-logs")).to_contain_text("update 5 done")
        expect(page.locator("#run-config")).to_contain_text('"group_size": 8')
        expect(page.locator("#speedup")).to_contain_text("×")
        bars = page.evaluate(
            "() => Chart.getChart('timeline-chart').data.datasets.map(d => d.data.length)"
        )
        assert len(bars) == 5 and all(n > 0 for n in bars), bars
        rewards = page.evaluate("() => Chart.getChart('reward-chart').data.datasets[0].data")
        assert len(rewards) == 6
        seen_updates = page.evaluate("() => Chart.getChart('step-chart').data.labels")
        assert seen_updates == [0, 1, 2, 3, 4, 5]
        # the step time and its parts (the API's step_s, rollout_s, learner_busy_s, barrier_s)
        parts = page.evaluate(
            "() => Chart.getChart('step-chart').data.datasets.map(d => d.data.filter(v => v > 0))"
        )
        assert [len(d) for d in parts] == [6, 6, 6, 6], parts
        expect(page.locator("#last-parts")).to_contain_text(" / ")
        # time to target vs the sync run: a target both reach at update 0 gives a ratio
        page.fill("#ttt-target", "-1")
        page.dispatch_event("#ttt-target", "change")
        expect(page.locator("#ttt")).to_contain_text("×")
        curves = page.evaluate(
            "() => Chart.getChart('ttt-chart').data.datasets.map(d => d.data.length)"
        )
        assert curves == [6, 6, 2], curves  # this run, the sync baseline, the target line

    shot = tmp_path / "dashboard-run.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / "dashboard-run.png")


def test_dashboard_asks_for_a_token_and_rejects_a_wrong_one(
    server: str, browser_page: object
) -> None:
    from playwright.sync_api import Page, expect

    page: Page = browser_page  # type: ignore[assignment]
    page.goto(server + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token-input", "wrong-token")
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_contain_text("401")
    page.fill("#token-input", ADMIN_TOKEN)
    page.click("#login-form button")
    expect(page.locator("#runs-view")).to_be_visible()
    expect(page.locator("#runs-empty")).to_be_visible()
