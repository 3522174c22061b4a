"""`tsrl bench host-adds`."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("host-adds")
def host_adds(
    elements: int = typer.Option(1 << 26, min=1 << 12, help="fp32 elements per add"),
    threads: list[int] = typer.Option([1, 2], help="thread counts (repeatable)"),
    rounds: int = typer.Option(5, min=1),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Host accumulation adds per thread count: throughput, bitwise check, s per trajectory."""
    from thundersync.bench.host_adds import run_host_adds

    if any(t < 1 for t in threads):
        raise typer.BadParameter("--threads: every count must be 1 or more")
    res = run_host_adds(elements, sorted(set(threads)), rounds)
    for row in res["rows"]:
        print(json.dumps(row) if as_json else row)
    summary = {k: v for k, v in res.items() if k != "rows"}
    print(json.dumps(summary) if as_json else json.dumps(summary, indent=2))
