"""The dashboard's runs list, submit form and run comparison in headless Chromium (issue 36):
sortable reward / step time / speedup columns, a form with labelled fields whose 422 messages
show next to the field they name, and two runs on one chart; screenshots go to out/screenshots/
(dashboard-runs-list.png, dashboard-submit-form.png, dashboard-compare.png)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import test_dashboard_e2e as e2e
from service_helpers import ADMIN_TOKEN

# the real app under uvicorn (SQLite, the stand-in driver) and a Chromium page: test_dashboard_e2e's
server = e2e.server
browser_page = e2e.browser_page


def _screenshot(page: object, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)  # type: ignore[attr-defined]
    assert shot.stat().st_size > 10_000
    e2e.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, e2e.SCREENSHOTS / name)


def _finished(api: httpx.Client, name: str, updates: int, schedule: str) -> str:
    res = api.post(
        "/api/v1/runs",
        json={
            "recipe": "grpo-toy",
            "name": name,
            "overrides": {"updates": updates, "schedule": schedule},
        },
    )
    assert res.status_code == 201, res.text
    run_id = str(res.json()["id"])
    deadline = time.monotonic() + 60
    while api.get(f"/api/v1/runs/{run_id}").json()["status"] != "succeeded":
        assert time.monotonic() < deadline, f"{name} did not finish"
        time.sleep(0.1)
    return run_id


def test_runs_list_submit_form_and_comparison(
    server: str, browser_page: object, tmp_path: Path
) -> None:
    from playwright.sync_api import Page, expect

    page: Page = browser_page  # type: ignore[assignment]
    failed: list[str] = []
    page.on(
        "response",
        lambda r: (
            failed.append(f"{r.status} {r.url}") if r.status == 404 or r.status >= 500 else None
        ),
    )
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as api:
        # the stand-in driver: step_s = 0.05 + 0.01 k and reward 0.1 k for update k
        sync_id = _finished(api, "sync-base", 4, "sync")
        stream_id = _finished(api, "stream-a", 6, "stream")
        _finished(api, "stream-b", 2, "stream")

    # --- the runs list: reward, median step time, speedup; a click on a header sorts ----------------
    page.goto(f"{server}/#token={ADMIN_TOKEN}")
    rows = page.locator("#runs-table tbody tr.run-row")
    expect(rows).to_have_count(3)
    headers = page.locator("#runs-table th[data-sort]").all_inner_texts()
    assert {"reward", "step time", "speedup", "status"} <= set(headers), headers
    names = lambda: page.eval_on_selector_all(  # noqa: E731
        "#runs-table tbody tr", "trs => trs.map(t => t.cells[1].textContent)"
    )
    page.click("#runs-table th[data-sort=name]")
    assert names() == ["stream-a", "stream-b", "sync-base"]
    page.click("#runs-table th[data-sort=name]")
    assert names() == ["sync-base", "stream-b", "stream-a"]
    page.click("#runs-table th[data-sort=step]")  # medians 0.055, 0.065, 0.075 s
    assert names() == ["stream-b", "sync-base", "stream-a"]
    expect(page.locator("#runs-table th[data-sort=step]")).to_have_attribute(
        "aria-sort", "ascending"
    )
    stream_row = page.locator(f"tr.run-row[data-id='{stream_id}']")
    expect(stream_row).to_contain_text("0.500")  # reward of update 5
    expect(stream_row).to_contain_text("75 ms")  # median step time
    # speedup: the sync run's mean step time over this one's (0.065 / 0.075 s here)
    expect(stream_row.locator("a[href^='#/compare/']")).to_have_text("0.87×")
    expect(page.locator(f"tr.run-row[data-id='{sync_id}'] td").nth(8)).to_have_attribute(
        "title", "a sync run is the baseline itself"
    )
    _screenshot(page, tmp_path, "dashboard-runs-list.png")

    # --- comparison: two picked runs on one chart each for reward and step time --------------------
    expect(page.locator("#compare-runs")).to_be_disabled()
    page.locator(f"tr.run-row[data-id='{sync_id}'] input.pick-run").check()
    page.locator(f"tr.run-row[data-id='{stream_id}'] input.pick-run").check()
    page.click("#compare-runs")
    expect(page.locator("#compare-view")).to_be_visible()
    expect(page.locator("#compare-table tbody tr")).to_have_count(2)
    for canvas in ("compare-reward-chart", "compare-step-chart"):
        sets = page.evaluate(
            f"() => Chart.getChart('{canvas}').data.datasets.map(d => [d.label, d.data.length])"
        )
        assert sorted(sets) == [["stream-a (stream)", 6], ["sync-base (sync)", 4]], sets
    expect(page.locator("#compare-table")).to_contain_text("baseline")
    _screenshot(page, tmp_path, "dashboard-compare.png")

    # --- the submit form: labelled fields from the schema and the artefacts; 422s by their field ----
    page.goto(f"{server}/#/new")
    for label in ("Recipe", "Run name", "Objective", "Schedule", "Updates", "Model", "Task set"):
        expect(page.get_by_label(label, exact=True)).to_be_visible()
    assert "grpo-toy (built-in)" in page.locator("#f-recipe option").all_inner_texts()
    assert "fully_async" in page.locator("#f-schedule option").all_inner_texts()
    page.fill("#f-updates", "0")
    page.fill("#ov-key-0", "optim.lr")
    page.fill("#ov-value-0", "-1")
    expect(page.locator(".override-row .hint")).to_contain_text("number")  # from the schema
    page.click("#new-run-form button[type=submit]")
    row_error = page.locator(".override-row .field-error")
    expect(row_error).to_contain_text("optim.lr: Input should be greater than 0")
    expect(page.locator("#err-updates")).to_contain_text("updates: Input should be greater than")
    expect(page.locator("#new-run-error")).to_have_text("")
    _screenshot(page, tmp_path, "dashboard-submit-form.png")
    page.fill("#f-updates", "2")
    page.fill("#ov-value-0", "0.01")
    page.fill("#f-name", "from-the-form")
    page.click("#new-run-form button[type=submit]")
    expect(page.locator("#run-name")).to_have_text("from-the-form")
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=60_000)
    assert failed == [], failed  # no 404 (the favicon included)
