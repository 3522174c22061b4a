"""`tsrl bench skyrl`: the streaming learner against SkyRL's own batch update."""

from __future__ import annotations

import json
from importlib.metadata import version

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("skyrl")
def bench_skyrl(
    updates: int = typer.Option(4, min=1),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32", help="float32 | float64 (models and accumulators)"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """GRPO and OPD parity with SkyRL's batch loss: gradient error per update at the same
    weights, parameter gap after each side trained on its own."""
    from thundersync.config import Objective
    from thundersync.skyrl.parity import run_parity

    if dtype not in ("float32", "float64"):
        raise typer.BadParameter("use --dtype float32 or --dtype float64")
    res: dict[str, object] = {"skyrl_version": version("skyrl")}
    # GRPO with SkyRL's sequence_mean and with its default token_mean; OPD's recipe
    cases = [("grpo", Objective.GRPO, None), ("grpo_token_mean", Objective.GRPO, "token_mean")]
    cases.append(("opd", Objective.OPD, None))
    for key, objective, reduction in cases:
        r = run_parity(objective, updates=updates, seed=seed, dtype=dtype, loss_reduction=reduction)
        res[key] = r
        if not as_json:
            typer.echo(
                f"{key}: grad rel err per update "
                + ", ".join(f"{e:.2e}" for e in r["grad_rel_err"])
                + f"; param gap after {updates} updates {r['parity_param_gap']:.2e}"
            )
    typer.echo(json.dumps(res))
