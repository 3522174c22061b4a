"""`tsrl bench teacher`: the teacher's cost per OPD turn vs turns, full-context vs incremental."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("teacher")
def teacher_cost(
    turns: str = typer.Option("2,8,16,32,64", help="turns per trajectory (comma-separated)"),
    tokens_per_turn: int = typer.Option(12, min=2, help="observation + action tokens per turn"),
    rounds: int = typer.Option(7, min=1, help="rounds (medians are reported)"),
    threads: int = typer.Option(1, min=1, help="torch threads"),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Teacher tokens and seconds per turn vs turns on the tiny teacher; last line: the ratios
    (most turns over fewest) and the incremental scores' max gap to full-context scores;
    `goal_met`: incremental CPU seconds per turn flat (ratio <= 1.5) and the gap <= 1e-5."""
    from thundersync.bench.teacher_cost import run_teacher_cost

    try:
        ts = tuple(int(x) for x in turns.split(","))
    except ValueError:
        raise typer.BadParameter("give comma-separated integers, e.g. --turns 2,8,64") from None
    if len(set(ts)) < 2 or min(ts) < 1:
        raise typer.BadParameter("give at least two positive turn counts, e.g. --turns 2,64")
    res = run_teacher_cost(
        ts, tokens_per_turn=tokens_per_turn, rounds=rounds, seed=seed, threads=threads
    )
    if not as_json:
        for r in res["rows"]:
            typer.echo(
                f"{r['turns']:>3} turns: full {r['full_s_per_turn'] * 1e3:7.2f} ms/turn "
                f"(CPU {r['full_cpu_s_per_turn'] * 1e3:6.2f}, {r['full_tokens_per_turn']:6.1f} "
                f"tok), incremental {r['incremental_s_per_turn'] * 1e3:6.2f} ms/turn (CPU "
                f"{r['incremental_cpu_s_per_turn'] * 1e3:5.2f}, "
                f"{r['incremental_tokens_per_turn']:5.1f} tok)"
            )
    typer.echo(json.dumps(res) if as_json else json.dumps(res, indent=2))
