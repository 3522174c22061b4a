"""`tsrl eval`: pass@k of a model on a task set (fresh env per attempt), as a table and JSON."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import app


@app.command("eval")
def eval_cmd(
    model: str = typer.Option(..., "--model", help="HF model directory"),
    tasks: str = typer.Option(
        "rollout/fixtures/toy_calc.jsonl", "--tasks", help=".jsonl task file or a directory of them"
    ),
    attempts: int = typer.Option(5, "--attempts", min=1, help="attempts per task (n)"),
    engine: str = typer.Option("hf", help="hf | vllm"),
    max_turns: int = typer.Option(4),
    max_new_tokens: int = typer.Option(64),
    temperature: float = typer.Option(1.0),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="last line is the JSON result"),
) -> None:
    """Unbiased pass@1/3/5 (1 - C(n-c,k)/C(n,k)) over the tasks."""
    from rich.console import Console
    from rich.table import Table

    from thundersync.rollout.evaluation import KS, run_eval

    try:
        res = run_eval(
            model,
            tasks,
            attempts,
            engine_kind=engine,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
    except (FileNotFoundError, ValueError) as e:
        typer.echo(f"eval: {e}", err=True)
        raise typer.Exit(2) from None
    table = Table(title=f"pass@k, {attempts} attempts per task")
    cols = ["instance_id", "n", "correct", "mean_reward", "malformed_calls"] + [
        f"pass@{k}" for k in KS
    ]
    for c in cols:
        table.add_column(c)

    def fmt(v: object) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    for row in res["per_task"]:
        table.add_row(*(fmt(row[c]) for c in cols))
    s = res["summary"]
    table.add_row(
        "ALL",
        str(attempts),
        "",
        fmt(s["mean_reward"]),
        str(s["malformed_calls"]),
        *(fmt(s[f"pass@{k}"]) for k in KS),
    )
    Console(stderr=as_json).print(table)
    if as_json:
        typer.echo(json.dumps(s))
