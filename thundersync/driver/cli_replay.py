"""`tsrl replay-gap RUN_DIR [--tolerance X] [--json]`: is a finished run identical to sync?

A run recorded with `record_batches: true` (e.g. `tsrl train R --set record_batches=true`, or the
same override on a service run) logs every source its learner applied and every version's
weights. This replays those sources through `sync` from theta_0 and prints
Delta_k = ||theta_k^run - theta_k^sync|| / ||theta_k^sync - theta_0|| per update: 0.0 when the
learner's streamed arithmetic equals sync's; exit code 1 when the largest gap is above
`--tolerance`. It checks the learner, not the data: an `async` run's sources come from older
policies (its `max_staleness`, printed too), and replaying the same sources gives 0.0 there as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from thundersync.cli_groups import app


@app.command("replay-gap")
def replay_gap_cmd(
    run_dir: Path = typer.Argument(..., help="a finished run's directory"),
    tolerance: float = typer.Option(0.0, min=0.0, help="largest gap that still passes"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object"),
) -> None:
    """Replay a recorded run's batches through sync and print each update's parameter gap."""
    from thundersync.config import ConfigError, load_run_config
    from thundersync.driver.assemble import build_models
    from thundersync.driver.replay_gap import replay_gap
    from thundersync.rundir import RunFiles

    files = RunFiles(run_dir)
    if not files.config.exists():
        typer.echo(f"{files.config}: no such file; RUN_DIR must be a run directory", err=True)
        raise typer.Exit(2)
    try:
        cfg = load_run_config(data=json.loads(files.config.read_text()))
    except ConfigError as e:
        typer.echo(f"{files.config}: invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    if not files.batch_logs():
        typer.echo(
            f"{files.batches}: no logged batches; run with record_batches=true "
            "(--set record_batches=true, or the same override on a service run)",
            err=True,
        )
        raise typer.Exit(2)
    student, _ = build_models(cfg, files)
    gaps = replay_gap(run_dir, cfg, student)
    worst = max(gaps)
    stale = max((int(m.get("max_staleness", 0)) for m in files.read_metrics()), default=0)
    out = {
        "run_dir": str(run_dir),
        "schedule": cfg.schedule.value,
        "gaps": gaps,
        "max_param_gap": worst,
        "tolerance": tolerance,
        "equal_to_sync": worst <= tolerance,
        "max_staleness": stale,
    }
    if as_json:
        typer.echo(json.dumps(out))
    else:
        for k, g in enumerate(gaps):
            typer.echo(f"update {k}: gap {g:.3g}")
        verdict = "within" if out["equal_to_sync"] else "ABOVE"
        typer.echo(f"max_param_gap {worst:.3g} ({verdict} {tolerance}), max_staleness {stale}")
    if not out["equal_to_sync"]:
        raise typer.Exit(1)
