"""The dashboard's Logs panel in headless Chromium (issue 36): the per-update log by default, the
driver's output one click away with its progress bars rendered (each in its last state), and a
run still setting up shows its stage as the run's status line."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from service_helpers import ADMIN_TOKEN
from test_dashboard_e2e import browser_page, server  # noqa: F401 - the fixtures
from test_run_logs import write_tqdm_stream


def test_logs_panel_defaults_to_the_per_update_log(
    server: str,  # noqa: F811
    browser_page: object,  # noqa: F811
    tmp_path: Path,
) -> None:
    from playwright.sync_api import Page, expect

    page: Page = browser_page  # type: ignore[assignment]
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server, headers=auth, timeout=30) as api:
        body = {"recipe": "grpo-toy", "name": "three", "overrides": {"updates": 3}}
        run = api.post("/api/v1/runs", json=body).json()
        while api.get(f"/api/v1/runs/{run['id']}").json()["status"] != "succeeded":
            time.sleep(0.1)
        staged = api.post("/api/v1/runs", json={"recipe": "grpo-toy", "name": "staged"}).json()
        # the output as a driver's libraries leave it: tqdm bars and colours
        write_tqdm_stream(tmp_path / "data" / "runs" / run["id"] / "output.log")

        page.goto(f"{server}/#token={ADMIN_TOKEN}")
        page.goto(f"{server}/#/runs/{run['id']}")
        logs = page.locator("#run-logs")
        expect(logs).to_contain_text("update 2 done")
        expect(page.locator("#log-src-log")).to_have_attribute("aria-pressed", "true")
        assert "Loading weights" not in logs.inner_text()

        page.click("#log-src-output")
        expect(logs).to_contain_text("Converting tensors: 100%")
        text = logs.inner_text()
        assert "update 2 done" not in text and "INFO engine ready" in text
        assert text.count("Loading weights") == 1 and "\r" not in text  # one line per bar
        expect(page.locator("#log-status")).to_contain_text("7/20")  # the bar still moving
        expect(page.locator("#log-src-output")).to_have_attribute("aria-pressed", "true")

        page.click("#log-src-log")
        expect(logs).to_contain_text("update 2 done")
        assert "Loading weights" not in logs.inner_text()

        # a run still converting its model says so on its page
        page.goto(f"{server}/#/runs/{staged['id']}")
        expect(page.locator("#run-reason")).to_contain_text("converting SmolLM2-135M")
        expect(logs).to_contain_text("stage: model: converting SmolLM2-135M")
        api.post(f"/api/v1/runs/{staged['id']}/cancel")
        expect(page.locator("#run-status")).to_have_text("cancelled", timeout=60_000)
