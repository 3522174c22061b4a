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


@bench_app.command("skyrl-loop")
def bench_skyrl_loop(
    rounds: int = typer.Option(3, min=1, help="paired rounds of the timed loops"),
    steps: int = typer.Option(3, min=2, help="updates per run (the first is warm-up)"),
    width: int = typer.Option(512, min=8, help="the tiny model's hidden size"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """SkyRL's own trainer loop with ThunderSync's streaming learner against SkyRL's sync loop:
    per-update gradient parity at the same weights, speedup over SkyRL sync and its bound, and
    SkyRL's fully-async trainer at staleness 1 on the same workload."""
    from thundersync.skyrl.loop_bench import LoopWorkload, parity, speed

    w = LoopWorkload(
        prompts=4,
        group_size=4,
        max_tokens=6,
        steps=steps,
        width=width,
        concurrency=2,
        tool_turns=3,
        tool_seconds=0.3,
    )
    res: dict[str, object] = {"skyrl_version": version("skyrl"), "workload": w.__dict__}
    res["parity"] = parity(LoopWorkload(prompts=2, group_size=3, max_tokens=6, steps=steps))
    res |= speed(w, rounds)
    if not as_json:
        p, s = res["parity"], res
        typer.echo(
            f"parity: grad rel err {p['parity_grad_rel_err']:.2e} (per update, same weights); "  # type: ignore[index]
            f"speedup vs SkyRL sync {s['speedup_vs_skyrl_sync']:.2f}x of bound {s['bound']:.2f} "
            f"(efficiency {s['efficiency']:.2f})"
        )
    typer.echo(json.dumps(res))
