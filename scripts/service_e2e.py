"""A recipe run end to end through the service, as a user would: `tsrl serve`, a sync run and a
stream run of the same recipe submitted over the API, both recorded (`record_batches`) and
checked with `tsrl replay-gap`, the stream run's speedup and time to target read from the API,
and its dashboard page (reward curve, time-to-target chart) rendered in headless Chromium.

    .venv/bin/python scripts/service_e2e.py --recipe grpo-smollm2-terminal --updates 3 --out DIR

Prints one JSON object (also DIR/service_e2e.json); exit code 1 when a run fails, a replay gap is
not 0, or the dashboard does not show the run's rewards. The service runs on SQLite in DIR/data
unless --database-url is given.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TSRL = [sys.executable, "-m", "thundersync.cli"]
DONE = {"succeeded", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_run(api: httpx.Client, run_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        run: dict[str, Any] = api.get(f"/api/v1/runs/{run_id}").json()
        if run["status"] in DONE:
            return run
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} still {run['status']} after {timeout_s:.0f} s")
        time.sleep(2)


def submit(api: httpx.Client, recipe: str, schedule: str, over: dict[str, Any]) -> str:
    body = {
        "recipe": recipe,
        "name": f"{recipe}-{schedule}",
        "overrides": over | {"schedule": schedule, "record_batches": True},
    }
    r = api.post("/api/v1/runs", json=body)
    if r.status_code != 201:
        raise SystemExit(f"POST /runs {schedule}: {r.status_code} {r.text}")
    return str(r.json()["id"])


def replay(run_dir: Path) -> dict[str, Any]:
    p = subprocess.run(
        [*TSRL, "replay-gap", str(run_dir), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise SystemExit(f"tsrl replay-gap {run_dir}: exit {p.returncode}\n{p.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def dashboard(base: str, token: str, run_id: str, shot: Path) -> dict[str, Any]:
    """The run's page in headless Chromium: its reward chart and the time-to-target chart."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1300, "height": 1250})
        page.goto(f"{base}/#token={token}")
        page.locator(f"tr.run-row[data-id='{run_id}']").click()
        expect(page.locator("#run-status")).to_have_text("succeeded", timeout=60_000)
        expect(page.locator("#speedup")).to_contain_text("×", timeout=30_000)
        rewards = page.evaluate("() => Chart.getChart('reward-chart').data.datasets[0].data")
        curves = page.evaluate(
            "() => Chart.getChart('ttt-chart').data.datasets.map(d => d.data.length)"
        )
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    return {"reward_chart": rewards, "ttt_chart_points": curves, "screenshot": str(shot)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="grpo-smollm2-terminal")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--database-url", default=None)
    ap.add_argument("--target", type=float, default=0.5, help="time-to-target reward")
    ap.add_argument("--timeout-s", type=float, default=1800, help="per run")
    args = ap.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    token, port = secrets.token_urlsafe(24), free_port()
    env = os.environ | {"TSRL_ADMIN_TOKEN": token}
    cmd = [*TSRL, "serve", "--port", str(port), "--data-dir", str(out / "data")]
    if args.database_url:
        cmd += ["--database-url", args.database_url]
    log = (out / "serve.log").open("w")
    srv = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as api:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if api.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or srv.poll() is not None:
                    raise SystemExit(f"the service did not start: see {out / 'serve.log'}")
                time.sleep(0.5)
            over = {"updates": args.updates}
            runs: dict[str, dict[str, Any]] = {}
            for schedule in ("sync", "stream"):  # the stream run's speedup needs the sync one
                rid = submit(api, args.recipe, schedule, over)
                run = wait_run(api, rid, args.timeout_s)
                ups = api.get(f"/api/v1/runs/{rid}/updates").json()["data"]
                runs[schedule] = {
                    "id": rid,
                    "status": run["status"],
                    "rewards": [u.get("reward_mean") for u in ups],
                    "step_s": [u.get("step_s") for u in ups],
                    "replay": replay(out / "data" / "runs" / rid),
                }
            sid = runs["stream"]["id"]
            speedup = api.get(f"/api/v1/runs/{sid}/speedup").json()
            ttt = api.get(f"/api/v1/runs/{sid}/time-to-target", params={"target": args.target})
            board = dashboard(base, token, sid, out / "dashboard-stream.png")
    finally:
        srv.send_signal(signal.SIGINT)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()
    result = {
        "recipe": args.recipe,
        "updates": args.updates,
        "runs": runs,
        "speedup": speedup,
        "time_to_target": ttt.json(),
        "dashboard": board,
    }
    ok = (
        all(r["status"] == "succeeded" for r in runs.values())
        and all(r["replay"]["max_param_gap"] == 0.0 for r in runs.values())
        and len(board["reward_chart"]) == args.updates
    )
    result["ok"] = ok
    (out / "service_e2e.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
