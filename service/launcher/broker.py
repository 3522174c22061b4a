"""A dead run's Redis keys: the launcher deletes them when it finalises a run whose driver is gone.

A driver on the Redis bus deletes its streams when it exits; a SIGKILLed one cannot (they would
only expire after `bus.factory.RUN_STREAM_TTL_S`). Its keys are `tsrl:<bus run id>:<topic>`
(`bus.factory.open_run_bus`), the bus run id being the service's run id (TSRL_RUN_ID) or, from a
driver that names its bus itself, `<config name>-<driver pid>-<unix start second>`. Both forms
are matched here, the second only with this run's name and pid and a start second inside the
run's lifetime, so no other run's keys are touched. A broker that does not answer is skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("tsrl.service.launcher")

KEY_PREFIX = "tsrl"  # bus.factory.open_run_bus: f"tsrl:{run_id}"


@dataclass(frozen=True)
class RunBusIds:
    """What the service knows of a run that names its bus keys."""

    run_id: str
    name: str
    pid: int | None
    started: float | None  # unix seconds
    finished: float  # unix seconds


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def patterns(ids: RunBusIds) -> list[tuple[str, re.Pattern[str] | None]]:
    """(SCAN MATCH pattern, stricter regex the key must also match) per key form."""
    out: list[tuple[str, re.Pattern[str] | None]] = [(f"{KEY_PREFIX}:{ids.run_id}:*", None)]
    if ids.pid is not None:
        head = f"{KEY_PREFIX}:{ids.name}-{ids.pid}-"
        out.append(
            (_glob_escape(head) + "*", re.compile(re.escape(head) + r"(\d+):[A-Za-z0-9_:-]+$"))
        )
    return out


def _in_lifetime(ids: RunBusIds, match: re.Match[str]) -> bool:
    second = int(match.group(1))
    lo = (ids.started or ids.finished) - 120
    return lo <= second <= ids.finished + 5


def run_keys(client: object, ids: RunBusIds) -> list[str]:
    keys: list[str] = []
    for pattern, strict in patterns(ids):
        for raw in client.scan_iter(match=pattern, count=1000):  # type: ignore[attr-defined]
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            if strict is not None:
                m = strict.match(key)
                if m is None or not _in_lifetime(ids, m):
                    continue
            keys.append(key)
    return keys


def clean_run_keys(url: str | None, runs: Iterable[RunBusIds], *, timeout_s: float = 1.0) -> int:
    """Delete the bus keys of these (dead) runs; the number of keys deleted (0 if the broker is
    not configured or does not answer)."""
    runs = list(runs)
    if not url or not runs:
        return 0
    try:
        import redis
    except ImportError:
        return 0
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    deleted = 0
    try:
        for ids in runs:
            keys = run_keys(client, ids)
            if keys:
                deleted += int(client.delete(*keys))
                log.info(
                    "run %s: deleted %d Redis bus keys of its dead driver", ids.run_id, len(keys)
                )
    except redis.RedisError as err:
        log.debug("broker cleanup skipped (%s): %s", url, err)
    finally:
        client.close()
    return deleted
