"""`tsrl train CONFIG [--run-dir DIR] [--set k=v] [--resume] [--bus process|redis] [--ray ADDR]`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from thundersync.bus.factory import BusKind
from thundersync.cli_groups import app


@app.command("train")
def train(
    config: str = typer.Argument(..., help="recipe name, recipe .yaml, or resolved config .json"),
    run_dir: str = typer.Option(None, help="run directory (default: runs/<name>)"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set updates=2"),
    resume: bool = typer.Option(False, help="continue from the run directory's checkpoint"),
    bus: BusKind = typer.Option(
        None, help="process (embedded default) | redis (default with --ray); not inproc"
    ),
    ray: str = typer.Option(None, "--ray", help="place the learner on Ray: ADDRESS or 'local'"),
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Train a run: rollouts overlap the learner (own process); writes the run directory."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from thundersync import stages
    from thundersync.bus.factory import run_bus_kind
    from thundersync.bus.protocol import BusError
    from thundersync.config import ConfigError, load_config_arg, parse_set_overrides
    from thundersync.driver.run import EXIT_CANCELLED, RunDriver
    from thundersync.rundir import RunStatus
    from thundersync.sandbox.envs.taskset_check import TaskSetError, check_before_start

    try:
        cfg = load_config_arg(config, parse_set_overrides(set_))
        run_bus_kind(bus, on_ray=ray is not None)  # refused here, before anything starts
        check_before_start(cfg)  # every task runnable on env.sandbox (images: docker)
    except (ConfigError, BusError, TaskSetError) as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    # their per-file tqdm bars would run into the status line below, which says what they did;
    # the environment variable reaches the learner's processes
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    default_dir = cfg.output_dir if cfg.output_dir != "runs/default" else f"runs/{cfg.name}"
    rd = Path(run_dir or default_dir)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[count]}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=quiet,
    ) as prog:
        name, count = f"{cfg.name} ({cfg.schedule.value})", f"0/{cfg.updates}"
        task = prog.add_task(name, total=cfg.updates, info="", count=count)
        # the driver's current stage (model download, engine start, rollouts, learner) as one
        # status line under the bar, redrawn in place: no tqdm spam, stdout's last line stays JSON
        stage_row = prog.add_task("stage", total=None, info="starting", count="")

        def on_stage(stage: stages.Stage) -> None:
            prog.update(stage_row, description=stage.kind, info=stage.line())

        def progress(rec: dict[str, Any]) -> None:
            prog.update(
                task,
                completed=rec["update"] + 1,
                count=f"{rec['update'] + 1}/{cfg.updates}",
                info=f"reward {rec['reward_mean']:.3f}  step {rec['step_s']:.2f}s",
            )

        driver = RunDriver(cfg, rd, resume=resume, bus_kind=bus, progress=progress, ray_address=ray)
        from thundersync.plan.guard import PlanRefused

        try:
            with stages.listening(on_stage):
                code = driver.run()
        except PlanRefused as e:  # the memory plan does not fit: nothing was started
            typer.echo(f"refused: {e}", err=True)
            raise typer.Exit(2) from None
        prog.update(stage_row, visible=False)
    status = RunStatus.CANCELLED if code == EXIT_CANCELLED else RunStatus.SUCCEEDED
    typer.echo(json.dumps({"run_dir": str(rd), "status": status.value}))
    if code:
        raise typer.Exit(code)
