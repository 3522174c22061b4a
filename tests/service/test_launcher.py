"""The launcher against the run-directory contract: exit codes and status.json map to final states
with reasons, cancel goes through DIR/CANCEL, ingestion is exactly-once, and a restarted service
reconciles runs left active (nothing stays "running")."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, FAKE_DRIVER, bearer, make_settings, wait_final, wait_for
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from thundersync.rundir import RunStatus
from thundersync.service.db import upgrade_to_head
from thundersync.service.main import create_app
from thundersync.service.security import hash_token
from thundersync.service.settings import Settings
from thundersync.service.tables import Run, Token

Headers = Callable[[str], dict[str, str]]


def submit(client: TestClient, h: dict[str, str], **body: object) -> str:
    res = client.post("/api/v1/runs", json={"recipe": "grpo-toy", **body}, headers=h)
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


def test_failing_driver_is_failed_with_its_last_output(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    final = wait_final(client, submit(client, h, name="fail-now"), h)
    assert final["status"] == "failed"
    assert "exited with code 1" in final["reason"] and "failed on purpose" in final["reason"]


def test_status_file_wins_over_exit_code(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    final = wait_final(client, submit(client, h, name="crash-after-status"), h)
    assert final["status"] == "failed" and final["reason"] == "NaN loss at update 0"


def test_cancel_stops_the_driver_at_a_barrier(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    run_id = submit(client, h, name="slow", overrides={"updates": 1000})
    wait_for(
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=h).json(),
        lambda r: r["updates_done"] >= 1,
    )
    res = client.post(f"/api/v1/runs/{run_id}/cancel", headers=h)
    assert res.status_code == 200 and res.json()["cancel_requested"] is True
    final = wait_final(client, run_id, h)
    assert final["status"] == "cancelled" and final["reason"].startswith("cancelled after update")
    done = final["updates_done"]
    assert 1 <= done < 1000
    assert client.get(f"/api/v1/runs/{run_id}/updates", headers=h).json()["count"] == done
    again = client.post(f"/api/v1/runs/{run_id}/cancel", headers=h)
    assert again.status_code == 409


def test_cancel_of_a_queued_run_is_immediate(settings: Settings) -> None:
    # only this app (no launcher) on the database: a second app's launcher (e.g. the one behind
    # the `new_token` fixture) would start the queued run before the cancel lands
    with TestClient(create_app(settings, launch=False)) as c:
        h = bearer(ADMIN_TOKEN)
        run_id = submit(c, h)
        res = c.post(f"/api/v1/runs/{run_id}/cancel", headers=h).json()
        assert res["status"] == "cancelled" and "before it started" in res["reason"]


def test_missing_driver_executable_fails_with_reason(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path, driver_command=["/nonexistent/tsrl", "train"])
    with TestClient(create_app(settings)) as c:
        h = bearer(ADMIN_TOKEN)
        final = wait_final(c, submit(c, h), h)
        assert final["status"] == "failed" and "could not start the driver" in final["reason"]


def test_driver_never_sees_service_secrets(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSRL_ADMIN_TOKEN", ADMIN_TOKEN)
    script = tmp_path / "env_driver.py"
    script.write_text(
        "import os, sys, json, pathlib\n"
        "d = pathlib.Path(sys.argv[sys.argv.index('--run-dir') + 1])\n"
        "print('\\n'.join(f'{k}={v}' for k, v in os.environ.items()))\n"
        "(d / 'status.json').write_text(json.dumps({'status': 'succeeded', 'reason': 'env'}))\n"
    )
    settings = make_settings(database_url, tmp_path, driver_command=[sys.executable, str(script)])
    with TestClient(create_app(settings)) as c:
        h = bearer(ADMIN_TOKEN)
        run_id = submit(c, h)
        assert wait_final(c, run_id, h)["status"] == "succeeded"
        out = c.get(f"/api/v1/runs/{run_id}/logs?source=output", headers=h).json()["text"]
    assert f"TSRL_RUN_ID={run_id}" in out
    assert ADMIN_TOKEN not in out and "TSRL_ADMIN_TOKEN" not in out


def _seed_active_run(settings: Settings, run_dir: Path, status: RunStatus, pid: int | None) -> str:
    """A run row as a crashed service would have left it."""
    engine = create_engine(settings.db_url)
    upgrade_to_head(engine)
    with Session(engine) as s:
        owner = Token(name="admin", token_hash=hash_token(ADMIN_TOKEN), is_admin=True)
        s.add(owner)
        s.flush()
        run = Run(
            id=uuid.uuid4(),
            owner_id=owner.id,
            name="orphan",
            recipe="grpo-toy",
            objective="grpo",
            schedule="stream",
            config={"updates": 2, "name": "slow"},
            status=status,
            reason="driver running",
            run_dir=str(run_dir),
            pid=pid,
        )
        s.add(run)
        s.commit()
        run_id = str(run.id)
    engine.dispose()
    return run_id


def test_restart_fails_a_run_whose_driver_is_gone(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path)
    run_dir = tmp_path / "orphan"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"type": "update", "update": 0}) + "\n")
    run_id = _seed_active_run(settings, run_dir, RunStatus.RUNNING, pid=None)
    with TestClient(create_app(settings)) as c:
        got = c.get(f"/api/v1/runs/{run_id}", headers=bearer(ADMIN_TOKEN)).json()
    assert got["status"] == "failed" and "service restarted" in got["reason"]
    assert got["updates_done"] == 1


def test_restart_takes_the_outcome_from_status_json(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path)
    run_dir = tmp_path / "orphan"
    run_dir.mkdir()
    lines = [json.dumps({"type": "update", "update": k, "step_s": 1.0}) for k in range(2)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "status.json").write_text('{"status": "succeeded", "reason": "2 updates"}')
    run_id = _seed_active_run(settings, run_dir, RunStatus.STARTING, pid=None)
    with TestClient(create_app(settings)) as c:
        h = bearer(ADMIN_TOKEN)
        got = c.get(f"/api/v1/runs/{run_id}", headers=h).json()
        assert got["status"] == "succeeded" and got["reason"] == "2 updates"
        assert c.get(f"/api/v1/runs/{run_id}/updates", headers=h).json()["count"] == 2


def test_update_times_are_served_with_units_and_legacy_keys_read_into_them(
    database_url: str, tmp_path: Path
) -> None:
    """metrics.jsonl's `rollout_s` / `learner_busy_s` / `barrier_s` reach the API under those names;
    a line a driver wrote before the rename (`R` / `L` / `P`) fills the same fields."""
    settings = make_settings(database_url, tmp_path)
    run_dir = tmp_path / "orphan"
    run_dir.mkdir()
    times = {"rollout_s": 3.0, "learner_busy_s": 2.5, "barrier_s": 0.4}
    lines = [{"update": 0, **times}, {"update": 1, "R": 3.0, "L": 2.5, "P": 0.4}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "status.json").write_text('{"status": "succeeded", "reason": "2 updates"}')
    run_id = _seed_active_run(settings, run_dir, RunStatus.STARTING, pid=None)
    with TestClient(create_app(settings)) as c:
        got = c.get(f"/api/v1/runs/{run_id}/updates", headers=bearer(ADMIN_TOKEN)).json()
    assert [{k: u[k] for k in times} for u in got["data"]] == [times, times]
    assert all(not {"R", "L", "P"} & set(u["extra"]) for u in got["data"])


def test_restart_adopts_a_live_driver_and_ingests_exactly_once(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path)
    run_dir = tmp_path / "orphan"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"name": "slow", "updates": 15}))
    proc = subprocess.Popen(
        [*FAKE_DRIVER, str(run_dir / "config.json"), "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        run_id = _seed_active_run(settings, run_dir, RunStatus.RUNNING, pid=proc.pid)
        with TestClient(create_app(settings)) as c:
            h = bearer(ADMIN_TOKEN)
            mid = wait_for(
                lambda: c.get(f"/api/v1/runs/{run_id}", headers=h).json(),
                lambda r: r["updates_done"] >= 1,
            )
            assert mid["status"] == "running"
        # a second restart while the driver still runs: offsets persist, nothing is read twice
        with TestClient(create_app(settings)) as c:
            final = wait_final(c, run_id, h)
            ups = c.get(f"/api/v1/runs/{run_id}/updates", headers=h).json()
            spans = c.get(f"/api/v1/runs/{run_id}/spans", headers=h).json()
    finally:
        proc.kill()
        proc.wait()
    assert final["status"] == "succeeded", final
    assert [u["update"] for u in ups["data"]] == list(range(15))
    assert spans["count"] == 15 * 5
    engine = create_engine(settings.db_url)
    with Session(engine) as s:
        run = s.scalar(select(Run).where(Run.id == uuid.UUID(run_id)))
        assert run is not None and run.metrics_offset == (run_dir / "metrics.jsonl").stat().st_size
    engine.dispose()


def test_stopping_the_service_cancels_its_runs(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path)
    h = bearer(ADMIN_TOKEN)
    with TestClient(create_app(settings)) as c:
        run_id = submit(c, h, name="slow", overrides={"updates": 1000})
        wait_for(
            lambda: c.get(f"/api/v1/runs/{run_id}", headers=h).json(),
            lambda r: r["status"] == "running",
        )
    with TestClient(create_app(settings, launch=False)) as c:
        got = c.get(f"/api/v1/runs/{run_id}", headers=h).json()
    assert got["status"] == "cancelled" and got["finished_at"] is not None


def test_ray_launcher_without_ray_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from thundersync.service.launcher.supervisor import make_backend

    # ray is a dev dependency here: hide it, as on a machine without the [ray] extra
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)
    settings = make_settings("sqlite://", tmp_path, launcher="ray")
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[ray\]'"):
        make_backend(settings)
