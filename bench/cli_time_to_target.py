"""`tsrl bench time-to-target [--json]`: wall time to a reward target, sync / stream / async."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("time-to-target")
def time_to_target(
    updates: int = typer.Option(8, min=2, help="updates per schedule"),
    target: float = typer.Option(0.5, help="mean reward of an update to reach"),
    budget_s: float = typer.Option(
        None, "--budget-s", help="wall-clock budget for reward_at_budget (default: half of sync's)"
    ),
    schedules: str = typer.Option(
        "sync,stream,async,fully_async", help="comma-separated; sync and stream are needed"
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="workload override, e.g. --set optim.lr=0.002"
    ),
    out: str = typer.Option(None, help="keep the run directories (and the PNG) here"),
    plot: str = typer.Option(None, help="PNG path (default: OUT/time_to_target.png)"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Train the digits GRPO workload under each schedule from the same theta_0 and seeds: time to
    `target`, reward at `budget`, staleness, per-update curves (sync == stream), a PNG plot."""
    from thundersync.bench.time_to_target import SCHEDULES, run_time_to_target
    from thundersync.config import ConfigError, parse_set_overrides

    picked = tuple(s.strip() for s in schedules.split(",") if s.strip())
    bad = [s for s in picked if s not in SCHEDULES]
    if bad or not {"sync", "stream"} <= set(picked):
        raise typer.BadParameter(f"--schedules: a subset of {','.join(SCHEDULES)} with sync,stream")
    try:
        res = run_time_to_target(
            updates=updates,
            target=target,
            budget_s=budget_s,
            schedules=picked,
            overrides=parse_set_overrides(set_),
            out=Path(out) if out else None,
            plot_path=Path(plot) if plot else None,
        )
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None
    ratio = res["stream_vs_sync_time_to_target"]
    res["goal_met"] = bool(
        ratio is not None
        and ratio >= 1.5
        and res["sync_stream_curves_equal"]
        and all(res["stale_curves_differ"].values())
        and res["max_staleness"].get("async", 1) > 0
    )
    if not as_json:
        for s, r in res["schedules"].items():
            typer.echo(
                f"{s:12s} time-to-target {r['time_to_target_s']}  reward@budget "
                f"{r['reward_at_budget']}  max staleness {r['max_staleness']}  "
                f"step {r['step_s_mean']:.2f}s"
            )
        typer.echo(f"plot: {res['plot']}")
    typer.echo(
        json.dumps(res)
        if as_json
        else json.dumps({k: v for k, v in res.items() if k != "schedules"}, indent=2)
    )
