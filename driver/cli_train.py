"""`tsrl train CONFIG [--run-dir DIR] [--set k=v] [--resume]`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from tsrl.cli_groups import app


def _parse_sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set {kv!r}: write key=value, e.g. --set updates=2")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


@app.command("train")
def train(
    config: str = typer.Argument(..., help="recipe name, recipe .yaml, or resolved config .json"),
    run_dir: str = typer.Option(None, help="run directory (default: runs/<name>)"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set updates=2"),
    resume: bool = typer.Option(False, help="continue from the run directory's checkpoint"),
    bus: str = typer.Option("process", help="process (embedded) | redis"),
    ray: str = typer.Option(None, "--ray", help="place the learner on Ray: ADDRESS or 'local'"),
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Train a run: rollouts overlap the learner (own process); writes the run directory."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from driver.run import EXIT_CANCELLED, RunDriver, load_config_arg
    from tsrl.config import ConfigError

    try:
        cfg = load_config_arg(config, _parse_sets(set_))
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    default_dir = cfg.output_dir if cfg.output_dir != "runs/default" else f"runs/{cfg.name}"
    rd = Path(run_dir or default_dir)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=quiet,
    ) as prog:
        task = prog.add_task(f"{cfg.name} ({cfg.schedule.value})", total=cfg.updates, info="")

        def progress(rec: dict[str, Any]) -> None:
            prog.update(
                task,
                completed=rec["update"] + 1,
                info=f"reward {rec['reward_mean']:.3f}  step {rec['step_s']:.2f}s",
            )

        if ray is not None and bus == "process":
            bus = "redis"  # a Ray actor cannot share the embedded process bus
        driver = RunDriver(cfg, rd, resume=resume, bus_kind=bus, progress=progress, ray_address=ray)
        code = driver.run()
    typer.echo(
        json.dumps(
            {"run_dir": str(rd), "status": "cancelled" if code == EXIT_CANCELLED else "succeeded"}
        )
    )
    if code:
        raise typer.Exit(code)
