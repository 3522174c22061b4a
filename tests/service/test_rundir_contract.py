"""The service and the driver agree on the run directory (tsrl/rundir.py): a directory written with
the driver's own writer (`RunDirWriter`) is ingested by the launcher and finalised with the status
the driver wrote, stored as the same string; a started run is seen as running once the driver has
written; the service's cancel is the file the driver checks. If either side spelled a file name or
a status value differently, this fails."""

from __future__ import annotations

import uuid
from pathlib import Path

from service_helpers import make_settings
from sqlalchemy import select, text

from thundersync.rundir import FINAL_STATUSES, RunDirWriter, RunFiles, RunStatus
from thundersync.service import crud
from thundersync.service.db import make_engine, make_session_factory, session_scope, upgrade_to_head
from thundersync.service.launcher import Launcher
from thundersync.service.tables import Run, SpanRow, Token


class _StillRunning:
    """A driver that has not exited (the launcher keeps supervising it)."""

    adopted = True

    def poll(self) -> int | None:
        return None

    def kill(self) -> None:
        raise AssertionError("nothing is cancelled by force here")

    def describe(self) -> tuple[int | None, str | None]:
        return None, None


class _AdoptOnly:
    """Backend whose drivers were started by an earlier service: alive only in `alive` dirs."""

    name = "embedded"

    def __init__(self, alive: set[str]) -> None:
        self.alive = alive

    def start(self, run_id: str, config_path: Path, run_dir: Path) -> None:
        raise AssertionError("no run is queued in this test")

    def adopt(self, pid: int | None, job_id: str | None, run_dir: str) -> _StillRunning | None:
        return _StillRunning() if run_dir in self.alive else None


def _write_updates(writer: RunDirWriter, updates: int) -> None:
    for k in range(updates):
        writer.write_spans(
            [
                {
                    "type": "span",
                    "update": k,
                    "role": role,
                    "kind": f"{role}-work",
                    "ids": {"source": f"s{k}", "group": 0},
                    "start": 100.0 + k + 0.1 * i,
                    "end": 100.05 + k + 0.1 * i,
                }
                for i, role in enumerate(("rollout", "learner", "barrier"))
            ]
        )
        writer.write_update({"update": k, "schedule": "stream", "time": 101.0 + k, "step_s": 1.0})
        writer.write_log(f"update {k} done")


def test_driver_written_run_dirs_are_ingested_and_finalised(
    database_url: str, tmp_path: Path
) -> None:
    engine = make_engine(database_url)
    upgrade_to_head(engine)
    factory = make_session_factory(engine)
    dirs = {status: tmp_path / "runs" / status.value for status in FINAL_STATUSES}
    live_dir = tmp_path / "runs" / "live"
    for status, run_dir in dirs.items():
        writer = RunDirWriter(run_dir)
        _write_updates(writer, 2)
        writer.write_status(status, f"the driver says {status.value}")
        writer.close()
    live = RunDirWriter(live_dir)
    _write_updates(live, 1)
    with session_scope(factory) as session:
        owner = Token(name="u", token_hash=uuid.uuid4().hex)
        session.add(owner)
        session.flush()
        for name, run_dir, status in [
            *((s.value, d, RunStatus.RUNNING) for s, d in dirs.items()),
            ("live", live_dir, RunStatus.STARTING),
        ]:
            session.add(
                Run(
                    owner_id=owner.id,
                    name=name,
                    objective="grpo",
                    schedule="stream",
                    config={"updates": 2},
                    status=status,
                    run_dir=str(run_dir),
                )
            )

    launcher = Launcher(
        make_settings(database_url, tmp_path / "data"), factory, _AdoptOnly({str(live_dir)})
    )
    launcher.tick()

    with session_scope(factory) as session:
        runs = {r.name: r for r in session.scalars(select(Run))}
        for status in FINAL_STATUSES:
            run = runs[status.value]
            assert run.status is status and run.reason == f"the driver says {status.value}"
            assert run.updates_done == 2 and run.finished_at is not None
            assert run.metrics_offset == RunFiles(run.run_dir).metrics.stat().st_size
            spans = session.scalars(select(SpanRow).where(SpanRow.run_id == run.id)).all()
            assert len(spans) == 6
        run = runs["live"]
        assert run.status is RunStatus.RUNNING and run.updates_done == 1
        crud.request_cancel(session=session, run=run)
    assert live.cancel_requested  # the driver sees the service's cancel
    live.close()

    with engine.connect() as conn:  # the column keeps the plain strings (no data migration)
        stored = {n: s for n, s in conn.execute(text("SELECT name, status FROM runs"))}
    assert stored == {s.value: s.value for s in FINAL_STATUSES} | {"live": "running"}
    assert all(type(v) is str for v in stored.values())
    engine.dispose()
