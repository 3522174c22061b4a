"""`tsrl bench bus`: publish -> receive latency of the in-process and Redis Streams backends."""

from __future__ import annotations

import json
import uuid

import typer

from thundersync.cli_groups import bench_app

INPROC_GOAL_MS = 5.0
REDIS_GOAL_MS = 20.0


@bench_app.command("bus")
def bench_bus(
    n: int = typer.Option(500, help="events per backend"),
    interval_ms: float = typer.Option(1.0, help="pause between publishes"),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/0", help="'' skips Redis"),
    as_json: bool = typer.Option(False, "--json", help="last line: JSON summary"),
) -> None:
    """Latency p50/p99 of publish -> consumer receive (goals: inproc p99 <= 5 ms, Redis <= 20 ms)."""
    from thundersync.bus.inproc import InProcessBus
    from thundersync.bus.latency import measure_latency

    result: dict[str, object] = {}
    inproc = measure_latency(InProcessBus(), n=n, interval_s=interval_ms / 1000)
    result.update(inproc_p50_ms=inproc.p50_ms, inproc_p99_ms=inproc.p99_ms)
    if redis_url:
        from thundersync.bus.redis_streams import RedisStreamsBus

        rbus = RedisStreamsBus(url=redis_url, prefix=f"tsrl-bench-{uuid.uuid4().hex[:8]}")
        try:
            red = measure_latency(rbus, n=n, interval_s=interval_ms / 1000)
        finally:
            keys = list(rbus.client.scan_iter(match=f"{rbus.prefix}:*"))
            if keys:
                rbus.client.delete(*keys)
            rbus.close()
        result.update(redis_p50_ms=red.p50_ms, redis_p99_ms=red.p99_ms)
    result["n"] = n
    result["inproc_goal_met"] = inproc.p99_ms <= INPROC_GOAL_MS
    if redis_url:
        result["redis_goal_met"] = float(result["redis_p99_ms"]) <= REDIS_GOAL_MS  # type: ignore[arg-type]
    rows = [(k, v) for k, v in result.items() if k.endswith("_ms")]
    for k, v in rows:
        typer.echo(f"{k:>16}  {float(v):8.3f}")  # type: ignore[arg-type]
    if as_json:
        typer.echo(json.dumps(result))
