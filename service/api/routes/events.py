"""Server-sent events for live run pages: status changes, new updates, new spans, new log text.

The stream polls the database (the launcher's ingest is the single writer), so any number of
service processes can serve pages for the same run. Events:
`run` (RunPublic), `updates` (list of UpdatePublic), `spans` ({t0, data: [SpanPublic]}),
`log` ({text, next_offset, partial}: the per-update log, or the rendered output with
`log_source=output`), and a final `end` once the run is finished and fully sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from thundersync.rundir import FINAL_STATUSES, RunFiles
from thundersync.service import crud
from thundersync.service.api.deps import OwnedRun
from thundersync.service.logs import LOG_SOURCES, LogSource, read_run_log
from thundersync.service.schemas import SpanPublic, UpdatePublic
from thundersync.service.tables import Run

router = APIRouter(prefix="/runs", tags=["events"])

HEARTBEAT_S = 15.0
SPANS_PER_EVENT = 2000


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


def _snapshot(
    factory: sessionmaker[Session],
    run_id: Any,
    after_update: int,
    after_span: int,
    log_at: int,
    log_source: LogSource,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    with factory() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None, [], {}, {}
        public = crud.run_public(run).model_dump(mode="json")
        updates, _ = crud.list_updates(
            session=session, run_id=run_id, skip=0, limit=1000, after=after_update
        )
        spans, _ = crud.list_spans(
            session=session,
            run_id=run_id,
            start=None,
            end=None,
            role=None,
            update=None,
            after_id=after_span,
            limit=SPANS_PER_EVENT,
        )
        t0 = crud.timeline_origin(session=session, run_id=run_id) if spans else None
        log = read_run_log(RunFiles(run.run_dir), log_source, log_at, 65536)
        return (
            public,
            [UpdatePublic.model_validate(u).model_dump(mode="json") for u in updates],
            {
                "t0": t0,
                "data": [SpanPublic.model_validate(s).model_dump(mode="json") for s in spans],
            },
            log.model_dump(mode="json"),
        )


@router.get(
    "/{run_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "an SSE stream"}},
)
async def run_events(
    request: Request,
    run: OwnedRun,
    after_update: Annotated[int, Query(ge=-1, le=2**31 - 1)] = -1,
    after_span: Annotated[int, Query(ge=0, le=2**62)] = 0,
    log_offset: Annotated[int, Query(ge=0, le=1 << 40)] = 0,
    log_source: Annotated[LogSource, Query(description=LOG_SOURCES)] = "log",
) -> StreamingResponse:
    """Live view of one run until it finishes (then `end`). Resume with the after_* cursors."""
    factory = request.app.state.session_factory
    poll_s = request.app.state.settings.poll_interval_s
    run_id = run.id

    async def stream() -> AsyncIterator[bytes]:
        nonlocal after_update, after_span, log_offset
        last_run: dict[str, Any] | None = None
        last_partial = ""
        last_sent = time.monotonic()
        while True:
            public, updates, spans, log = await anyio.to_thread.run_sync(
                _snapshot, factory, run_id, after_update, after_span, log_offset, log_source
            )
            if public is None:
                yield sse("end", {"reason": "run deleted"})
                return
            out: list[bytes] = []
            if public != last_run:
                out.append(sse("run", public))
                last_run = public
            if updates:
                after_update = updates[-1]["update"]
                out.append(sse("updates", updates))
            if spans["data"]:
                after_span = spans["data"][-1]["id"]
                out.append(sse("spans", spans))
            if log["text"] or log["partial"] != last_partial:
                log_offset, last_partial = log["next_offset"], log["partial"]
                keys = ("text", "next_offset", "partial")
                out.append(sse("log", {k: log[k] for k in keys}))
            for chunk in out:
                yield chunk
            if out:
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent > HEARTBEAT_S:
                yield b": keep-alive\n\n"
                last_sent = time.monotonic()
            done = public["status"] in FINAL_STATUSES
            if done and not updates and not spans["data"] and not log["text"]:
                yield sse("end", {"status": public["status"]})
                return
            if await request.is_disconnected():
                return
            await anyio.sleep(poll_s)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
