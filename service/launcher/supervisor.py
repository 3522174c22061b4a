"""The launcher loop: one background thread that starts queued runs, ingests the files of active
ones, forwards cancel requests, and finalises runs whose driver has exited.

It is the only writer of run state after `queued` (the API only queues, and cancels queued runs).
Runs that a previous service process left `starting` / `running` are reconciled: a driver still
alive is adopted and watched; otherwise the run is finalised from DIR/status.json, or failed with a
reason. One launcher per database. Every run finalised here has a dead driver: its Redis bus
keys, which a SIGKILLed driver leaves behind, are deleted (service/launcher/broker.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from thundersync.rundir import ACTIVE_STATUSES, RunFiles, RunStatus
from thundersync.service.db import session_scope, utcnow
from thundersync.service.launcher.backends import EXIT_UNKNOWN, EmbeddedBackend, Handle
from thundersync.service.launcher.broker import RunBusIds, clean_run_keys
from thundersync.service.launcher.ingest import ingest_run
from thundersync.service.launcher.outcome import decide_outcome
from thundersync.service.run_state import transition
from thundersync.service.settings import Settings
from thundersync.service.tables import Run

log = logging.getLogger("tsrl.service.launcher")


def make_backend(settings: Settings) -> Any:
    if settings.launcher == "embedded":
        return EmbeddedBackend(settings.driver_command)
    if settings.launcher == "ray":
        from thundersync.service.launcher.ray_backend import RayJobBackend, ray_driver_command

        # the job runs on a Ray node: its `tsrl`, not this interpreter's path (settings default)
        return RayJobBackend(ray_driver_command(), settings.ray_address)
    raise ValueError(f"launcher {settings.launcher!r} unknown: use 'embedded' or 'ray'")


def bus_ids(run: Run) -> RunBusIds:
    return RunBusIds(
        run_id=str(run.id),
        name=str(run.config.get("name", run.name)),
        pid=run.pid,
        started=run.started_at.timestamp() if run.started_at is not None else None,
        finished=time.time(),
    )


class Launcher:
    def __init__(
        self, settings: Settings, factory: sessionmaker[Session], backend: Any = None
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.backend = backend if backend is not None else make_backend(settings)
        self.handles: dict[uuid.UUID, Handle] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.tick()  # reconcile before serving
        self._thread = threading.Thread(target=self._loop, name="tsrl-launcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, stop_runs: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if not stop_runs:
            return
        with self._lock:
            for run_id, handle in list(self.handles.items()):
                if handle.adopted:
                    continue
                with session_scope(self.factory) as session:
                    run = session.get(Run, run_id)
                    if run is not None:
                        RunFiles(run.run_dir).request_cancel()
                terminate = getattr(handle, "terminate", None)
                if terminate is not None:
                    terminate()
                deadline = time.monotonic() + 10
                while handle.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if handle.poll() is None:
                    handle.kill()
                with session_scope(self.factory) as session:
                    run = session.get(Run, run_id)
                    if run is not None:
                        self._finalize(session, run, handle, shutdown=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep supervising; the next tick retries
                log.exception("launcher tick failed")
            self._wake.wait(self.settings.poll_interval_s)
            self._wake.clear()

    # --- one pass -----------------------------------------------------------------------------------

    def tick(self) -> None:
        with self._lock:
            with session_scope(self.factory) as session:
                active = session.scalars(
                    select(Run).where(
                        Run.status.in_((RunStatus.STARTING, RunStatus.RUNNING)),
                        Run.backend == self.backend.name,
                    )
                ).all()
                for run in active:
                    self._supervise(session, run)
            self._start_queued()

    def _supervise(self, session: Session, run: Run) -> None:
        handle = self.handles.get(run.id)
        if handle is None:
            handle = self.backend.adopt(run.pid, run.job_id, run.run_dir)
            if handle is None:
                self._finalize(
                    session,
                    run,
                    None,
                    note="the service restarted and the driver is gone without a status.json",
                )
                return
            log.info("adopted run %s (pid %s)", run.id, run.pid)
            self.handles[run.id] = handle
        files = RunFiles(run.run_dir)
        if run.cancel_requested_at is not None:
            if not files.cancel_requested:
                files.request_cancel()
            waited = (utcnow() - run.cancel_requested_at).total_seconds()
            if waited > self.settings.cancel_grace_s and handle.poll() is None:
                handle.kill()
                self._finalize(session, run, handle, forced=True)
                return
        code = handle.poll()
        ingest_run(session, run)
        if code is not None:
            self._finalize(session, run, handle)
            return
        if run.status == RunStatus.STARTING and files.has_driver_output():
            transition(
                session,
                run.id,
                expect=(RunStatus.STARTING,),
                to=RunStatus.RUNNING,
                reason="driver running",
            )

    def _finalize(
        self,
        session: Session,
        run: Run,
        handle: Handle | None,
        *,
        forced: bool = False,
        shutdown: bool = False,
        note: str = "",
    ) -> None:
        ingest_run(session, run)
        code = handle.poll() if handle is not None else None
        if code == EXIT_UNKNOWN:
            code = None
            note = (
                note or "the driver (adopted after a service restart) exited without a status.json"
            )
        status, reason = decide_outcome(
            Path(run.run_dir),
            code,
            forced_after_cancel=forced,
            service_shutdown=shutdown,
            note=note,
        )
        session.flush()  # the ingested rows and offsets first
        transition(
            session,
            run.id,
            expect=ACTIVE_STATUSES,
            to=status,
            reason=reason,
            exit_code=code,
            finished_at=utcnow(),
        )
        self.handles.pop(run.id, None)
        log.info("run %s %s: %s", run.id, status, reason)
        clean_run_keys(self.settings.redis_url, [bus_ids(run)])

    def _start_queued(self) -> None:
        free = self.settings.max_concurrent_runs - len(self.handles)
        if free <= 0:
            return
        with session_scope(self.factory) as session:
            queued = session.scalars(
                select(Run)
                .where(Run.status == RunStatus.QUEUED, Run.backend == self.backend.name)
                .order_by(Run.created_at, Run.id)
                .limit(free)
            ).all()
            ids = [r.id for r in queued]
        for run_id in ids:
            self._start_one(run_id)

    def _start_one(self, run_id: uuid.UUID) -> None:
        """Claim the run (QUEUED -> STARTING, committed before anything starts), then start its
        driver. A cancel committed first wins the claim; one committed after finds the run active
        and is forwarded through DIR/CANCEL by `_supervise`. No write below touches the status of
        a run that left STARTING meanwhile."""
        with session_scope(self.factory) as session:
            claimed = transition(
                session,
                run_id,
                expect=(RunStatus.QUEUED,),
                to=RunStatus.STARTING,
                reason="starting the driver",
                started_at=utcnow(),
            )
            run = session.get(Run, run_id) if claimed else None
            if run is None:
                return
            config, run_dir = run.config, run.run_dir
        files = RunFiles(run_dir)
        files.root.mkdir(parents=True, exist_ok=True)
        files.config.write_text(json.dumps(config, indent=2))
        try:
            handle = self.backend.start(str(run_id), files.config, files.root)
        except Exception as err:
            reason = f"could not start the driver ({self.backend.name}): {err}"
            with session_scope(self.factory) as session:
                transition(
                    session,
                    run_id,
                    expect=(RunStatus.STARTING,),
                    to=RunStatus.FAILED,
                    reason=reason,
                    finished_at=utcnow(),
                )
            log.warning("run %s: %s", run_id, reason)
            return
        pid, job_id = handle.describe()
        self.handles[run_id] = handle
        with session_scope(self.factory) as session:
            transition(session, run_id, expect=ACTIVE_STATUSES, pid=pid, job_id=job_id)
        log.info("started run %s (%s, pid %s)", run_id, self.backend.name, pid)
