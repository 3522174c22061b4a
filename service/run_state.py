"""Run state changes as compare-and-set transitions: one conditional UPDATE that applies only while
the run is still in an expected state. The API (cancel) and the launcher (claim, start, finish)
write the same row from different sessions; a plain read-then-write lets the later commit undo the
earlier one (a cancel overwritten by a slow start). Both databases serialise the conditional
UPDATE on the row, so exactly one of two racing transitions applies and the other sees it did not.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import update
from sqlalchemy.orm import Session

from thundersync.rundir import RunStatus
from thundersync.service.tables import Run


def transition(
    session: Session,
    run_id: uuid.UUID,
    *,
    expect: Collection[RunStatus],
    to: RunStatus | None = None,
    **values: object,
) -> bool:
    """Set `values` (and `to` as the status) on the run if its status is in `expect`.

    Returns whether it applied. The caller's session must commit for the change to be seen; objects
    of the session that hold the run are refreshed from the row.
    """
    if to is not None:
        values["status"] = to
    result = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_(list(expect)))
        .values(**values)
        .execution_options(synchronize_session="fetch")
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
