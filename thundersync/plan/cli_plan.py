"""`tsrl plan` (the learner's memory plan for a recipe on a given machine) and
`tsrl bench plan-check` (the plan against measured and counted bytes)."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import app, bench_app


@app.command("plan")
def plan(
    recipe: str,
    set_: list[str] = typer.Option([], "--set", help="key=value overrides"),
    gpus: int = typer.Option(..., "--gpus", min=0, help="GPUs of the node (0: a CPU learner)"),
    gpu_memory: float = typer.Option(0.0, "--gpu-memory", min=0, help="GB per GPU"),
    host_memory: float = typer.Option(..., "--host-memory", min=0, help="GB of host memory"),
    shape: str = typer.Option(
        None, "--shape", help="model shape: a shipped name, a model dir or a config.json"
    ),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Every allocation the learner makes for RECIPE, per GPU / host / /dev/shm; exit 1 if it
    does not fit (the message names the setting that would make it fit)."""
    from rich.console import Console
    from rich.table import Table

    from thundersync.config import ConfigError, load_run_config, parse_set_overrides
    from thundersync.plan.advice import refuse
    from thundersync.plan.memory import GB, Machine, plan_memory
    from thundersync.plan.shape import ShapeError, shape_for_run

    if gpus and gpu_memory <= 0:
        raise typer.BadParameter("give --gpu-memory GB (per GPU) with --gpus N > 0")
    try:
        cfg = load_run_config(recipe, parse_set_overrides(set_))
        model_shape = shape_for_run(cfg.model.path, shape)
    except (ConfigError, ShapeError) as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    machine = Machine(gpus, int(gpu_memory * GB) if gpus else None, int(host_memory * GB))
    p = plan_memory(cfg, model_shape, machine)
    p.refusal = refuse(p, cfg)
    title = (
        f"memory plan: {cfg.name}, {model_shape.name} ({model_shape.params / 1e9:.2f} B params), "
        f"{cfg.learner.ranks} learner rank(s), {gpus} x {gpu_memory:g} GB GPUs, "
        f"{host_memory:g} GB host"
    )
    table = Table(title=title)
    for col in ("component", "where", "phase", "GB", "formula"):
        table.add_column(col)
    for c in p.components:
        table.add_row(c.name, c.where, c.phase, f"{c.bytes / GB:.2f}", c.formula)
    out = Console(stderr=as_json, width=160)
    out.print(table)
    out.print(
        f"per learner GPU {p.per_gpu_bytes / GB:.1f} GB (peak: {p.peak_phase('gpu')}), "
        f"rollout GPU weights {p.rollout_gpu_bytes / GB:.1f} GB, host {p.host_bytes / GB:.1f} GB "
        f"(peak: {p.peak_phase('host')}; /dev/shm {p.shm_bytes / GB:.1f} GB), fits: {p.fits}"
    )
    for note in p.notes:
        out.print(f"note: {note}")
    if p.refusal:
        out.print(f"refused: {p.refusal}")
    if as_json:
        print(json.dumps(p.to_json()))
    if not p.fits:
        raise typer.Exit(1)


@bench_app.command("plan-check")
def plan_check(
    big: bool = typer.Option(True, help="also count the 8B / 32B shapes on the meta device"),
    mid: bool = typer.Option(True, help="also measure a ~20M-parameter model (slower)"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Measure the learner's allocations (CPU, small models) and count parameter bytes of the
    shipped shapes (meta device); compare both with the plan."""
    from rich.console import Console
    from rich.table import Table

    from thundersync.plan.check import run_plan_check

    res = run_plan_check(big=big, mid=mid)
    table = Table(title="plan-check: measured or counted vs planned bytes")
    for col in ("case", "component", "how", "measured", "planned", "rel err"):
        table.add_column(col)
    for r in res["rows"]:
        table.add_row(
            r["case"],
            r["component"],
            r["how"],
            str(r["measured"]),
            str(r["planned"]),
            f"{r['rel_err']:.4f}",
        )
    Console(stderr=as_json, width=160).print(table)
    if as_json:
        print(json.dumps(res))
    else:
        typer.echo(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=2))
    if not res["goal_met"]:
        raise typer.Exit(1)
