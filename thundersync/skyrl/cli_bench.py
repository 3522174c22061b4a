"""`tsrl bench skyrl`: the streaming learner against SkyRL's own batch update."""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Any

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("skyrl")
def bench_skyrl(
    updates: int = typer.Option(4, min=1),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32", help="float32 | float64 (models and accumulators)"),
    loop_rounds: int = typer.Option(3, min=0, help="paired rounds of SkyRL's loop (0: none)"),
    loop_steps: int = typer.Option(3, min=2, help="updates per loop run (the first: warm-up)"),
    loop_width: int = typer.Option(512, min=8, help="the loop workload's model width"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """GRPO and OPD parity with SkyRL's batch loss (gradient error per update at the same
    weights, parameter gap after each side trained on its own), then SkyRL's own trainer loop:
    ThunderSync's streaming learner against SkyRL's sync update (per-update parity, speedup and
    its bound) and SkyRL's fully-async trainer at staleness 1 on the same workload."""
    from thundersync.config import Objective
    from thundersync.skyrl.parity import run_parity

    if dtype not in ("float32", "float64"):
        raise typer.BadParameter("use --dtype float32 or --dtype float64")
    res: dict[str, Any] = {"skyrl_version": version("skyrl")}
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
    if loop_rounds:
        res["loop"] = _loop(loop_rounds, loop_steps, loop_width, as_json)
        res["speedup_vs_skyrl_sync"] = res["loop"]["speedup_vs_skyrl_sync"]
        res["efficiency"] = res["loop"]["efficiency"]
    typer.echo(json.dumps(res))


def _loop(rounds: int, steps: int, width: int, quiet: bool) -> dict[str, Any]:
    from thundersync.skyrl.loop_bench import LoopWorkload, parity, speed

    # a trajectory: 1-3 sandboxed tool calls of ~0.3 s between short answers, 2 in flight on
    # the rollout core (SkyRL's agent loop starts them all; the engine serves 2 at a time)
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
    res: dict[str, Any] = {"workload": w.__dict__}
    res["parity"] = parity(LoopWorkload(prompts=2, group_size=3, max_tokens=6, steps=steps))
    res["parity_opd"] = parity(
        LoopWorkload(
            objective="opd", prompts=2, group_size=2, max_tokens=6, steps=steps, tool_turns=2
        )
    )
    res |= speed(w, rounds)
    if not quiet:
        typer.echo(
            f"loop: grad rel err {res['parity']['parity_grad_rel_err']:.2e} (GRPO), "
            f"{res['parity_opd']['parity_grad_rel_err']:.2e} (OPD) per update; "
            f"{res['speedup_vs_skyrl_sync']:.2f}x SkyRL sync, bound {res['bound']:.2f}, "
            f"efficiency {res['efficiency']:.2f}; SkyRL fully-async (staleness 1) "
            f"{res['skyrl_fully_async']['speedup_vs_skyrl_sync']:.2f}x"
        )
    return res
