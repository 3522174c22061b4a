"""`tsrl bench equivalence` and `tsrl bench learner-cost`."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import bench_app
from thundersync.config import Arch


@bench_app.command("equivalence")
def equivalence(
    objective: str = typer.Option("grpo", help="grpo | opd"),
    updates: int = typer.Option(10, min=1),
    ranks: int = typer.Option(1, help="1 or 2 (gloo, FSDP2)"),
    reward_offset: float = typer.Option(0.0, help="add X to every reward (GRPO)"),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32", help="learner parameters: float32 | bfloat16 | bf16"),
    arch: Arch = typer.Option(Arch.LLAMA, help="tiny model family: llama | qwen2 | qwen3"),
    device: str = typer.Option("cpu", help="where the learners run: cpu | cuda"),
    masked: bool = typer.Option(
        False, "--masked", help="drop failed rows mid-update (rollout.on_failure: drop)"
    ),
    groups: int = typer.Option(2, min=2, help="GRPO groups per update (OPD: trajectories x 2)"),
    max_open_groups: int = typer.Option(
        2, min=1, help="learner.max_open_groups: fewer than --groups defers groups' sources"
    ),
    grpo_sum: str = typer.Option(
        "float64",
        help="learner.grpo_sum: float64 (order-independent) | arrival (the run default; another "
        "arrival order changes roundings, so the judged reordered control fails)",
    ),
    reward_shift: float | None = typer.Option(
        None, help="learner.reward_shift: GRPO's c fixed before any reward (default: per grpo_sum)"
    ),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Replay logged batches through sync, group and stream; report parameter gaps per update."""
    from rich.console import Console
    from rich.table import Table

    from thundersync.bench.equivalence import run_equivalence
    from thundersync.config import Objective

    try:
        obj = Objective(objective)
    except ValueError:
        raise typer.BadParameter("use --objective grpo or --objective opd") from None
    dt = {"bf16": "bfloat16", "fp32": "float32"}.get(dtype, dtype)
    if dt not in ("float32", "bfloat16"):
        raise typer.BadParameter("use --dtype float32 or --dtype bf16")
    if grpo_sum not in ("arrival", "float64"):
        raise typer.BadParameter("use --grpo-sum arrival or --grpo-sum float64")
    res = run_equivalence(
        obj,
        updates=updates,
        ranks=ranks,
        reward_offset=reward_offset,
        seed=seed,
        dtype=dt,
        arch=arch,
        device=device,
        masked=masked,
        groups=groups,
        max_open_groups=max_open_groups,
        grpo_sum=grpo_sum,
        reward_shift=reward_shift,
    )
    title = (
        f"equivalence: {obj.value}, {arch.value}, {ranks} rank(s), reward offset {reward_offset}, "
        f"{groups} groups, max_open_groups {max_open_groups}, grpo_sum {grpo_sum}"
        + (", masked rows" if masked else "")
    )
    table = Table(title=title)
    cols = [c for c in res["per_update"][0] if c != "update"]
    table.add_column("k")
    for c in cols:
        table.add_column(c)
    for row in res["per_update"]:
        table.add_row(str(row["update"]), *(f"{row[c]:.2e}" for c in cols))
    Console(stderr=as_json).print(table)
    summary = {k: v for k, v in res.items() if k != "per_update"}
    if as_json:
        print(json.dumps(summary))
    else:
        typer.echo(json.dumps(summary, indent=2))
    if not res["goal_met"]:
        raise typer.Exit(1)


@bench_app.command("learner-cost")
def learner_cost(
    model: str = typer.Option("tiny", help="tiny | smollm2 (SmolLM2-135M, 163M parameters)"),
    seed: int = typer.Option(0),
    repeats: int = typer.Option(5, min=1, help="rounds (medians of per-round ratios)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stream vs sync vs textbook learners on the same GRPO batch: time, bookkeeping, peak RSS."""
    from thundersync.bench.learner_cost import run_learner_cost

    if model not in ("tiny", "smollm2"):
        raise typer.BadParameter("use --model tiny or --model smollm2")
    res = run_learner_cost(seed=seed, repeats=repeats, model=model)
    res["goal_met"] = (
        res["compute_ratio"] <= 1.15
        and res["peak_rss_ratio"] <= 1.10
        and res["bookkeeping_share"] <= 0.25
        and res["throughput_vs_textbook"] >= 0.9
    )
    typer.echo(json.dumps(res) if as_json else json.dumps(res, indent=2))


@bench_app.command("memory")
def memory(
    lengths: str = typer.Option("64,256,1024,4096,8192", help="GRPO continuation lengths"),
    turns: str = typer.Option("2,8,32,64", help="OPD turns per trajectory"),
    opd_turn_graphs: str = typer.Option("recompute", help="learner.opd_turn_graphs for OPD"),
    checkpointing: str = typer.Option(
        "none", help="learner.activation_checkpointing of stream and sync: none, segment, layer"
    ),
    repeats: int = typer.Option(3, min=1, help="rounds per point (medians are reported)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Peak learner memory: stream vs sync vs textbook, GRPO vs length and OPD vs turns."""
    from thundersync.bench.memory import run_memory

    try:
        ls = tuple(int(x) for x in lengths.split(","))
        ts = tuple(int(x) for x in turns.split(","))
    except ValueError:
        raise typer.BadParameter("give comma-separated integers, e.g. --turns 2,8,32") from None
    if opd_turn_graphs not in ("recompute", "keep", "auto"):
        raise typer.BadParameter("use --opd-turn-graphs recompute, keep or auto")
    if checkpointing not in ("none", "segment", "layer"):
        raise typer.BadParameter("use --checkpointing none, segment or layer")
    res = run_memory(ls, ts, opd_turn_graphs, repeats, checkpointing)
    typer.echo(json.dumps(res) if as_json else json.dumps(res, indent=2))
