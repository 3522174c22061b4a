"""`tsrl env check`: run the oracle and a no-op for tasks in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from thundersync.cli_groups import app

env_app = typer.Typer(
    no_args_is_help=True, help="Environments: SWE-smith, SETA / Terminal-Bench, Harbor."
)
app.add_typer(env_app, name="env")


@env_app.command("check")
def check(
    task_path: str = typer.Argument(
        None, help="task dir (TB1/SETA/Harbor) or SWE-smith .json/.jsonl"
    ),
    all_: bool = typer.Option(False, "--all", help="every shipped fixture"),
    hacks: bool = typer.Option(
        False, "--hacks", help="run the shipped hack suite instead: every hack must earn 0"
    ),
    backend: str = typer.Option("local", help="local | docker"),
    repos_dir: str = typer.Option(
        None, help="git mirrors for SWE-smith records (default: fixtures)"
    ),
    json_out: bool = typer.Option(False, "--json", help="print JSON; the last line is the summary"),
) -> None:
    """Gold must earn 1 and a no-op 0 (--hacks: every hack must be defeated); exit 1 otherwise."""
    from thundersync.sandbox.backends import get_executor
    from thundersync.sandbox.envs.check import check_all, check_path, summarize
    from thundersync.sandbox.envs.swesmith import RecordError
    from thundersync.sandbox.envs.terminal import TaskError
    from thundersync.sandbox.executor import SandboxError

    if hacks:
        if all_ or task_path:
            typer.echo("--hacks runs the shipped hack suite: give no TASK_PATH or --all", err=True)
            raise typer.Exit(2)
        _check_hacks(backend, json_out)
        return
    if not all_ and not task_path:
        typer.echo("give a TASK_PATH or --all", err=True)
        raise typer.Exit(2)
    try:
        ex = get_executor(backend)
        if all_:
            details = check_all(ex)
        else:
            details = check_path(Path(task_path), ex, Path(repos_dir) if repos_dir else None)
    except (RecordError, TaskError, SandboxError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    summary = summarize(details)
    if json_out:
        typer.echo(json.dumps(summary))
    else:
        for d in summary["details"]:
            gold = "n/a " if d["gold_reward"] is None else f"{d['gold_reward']:.2f}"
            typer.echo(
                f"{d['task']:<36} gold={gold} noop={d['noop_reward']:.2f}  {d['gold_reason']}"
            )
        for d in summary["skipped"]:
            typer.echo(f"{d['task']:<36} skipped: {d['reason']}")
        typer.echo(
            f"{summary['gold_ok']}/{summary['tasks']} gold ok, {summary['noop_ok']}/{summary['tasks']} no-op ok"
        )
    # a task without a solution (Harbor training tasks) has no gold to check: not a failure
    if not summary["gold_ok"] + summary["gold_unchecked"] == summary["noop_ok"] == summary["tasks"]:
        raise typer.Exit(1)


def _check_hacks(backend: str, json_out: bool) -> None:
    """`--hacks`: one line per hack (JSON with --json), the summary last; exit 1 unless every
    hack is defeated."""
    from thundersync.sandbox.backends import get_executor
    from thundersync.sandbox.envs.hacks import run_hacks, summarize
    from thundersync.sandbox.executor import SandboxError

    try:
        details = run_hacks(get_executor(backend))
    except SandboxError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    summary = summarize(details)
    for d in details:
        if json_out:
            typer.echo(
                json.dumps({k: d[k] for k in ("name", "task", "reward", "defeated", "reason")})
            )
        else:
            verdict = "defeated" if d["defeated"] else "NOT DEFEATED"
            typer.echo(f"{d['name']:<28} {d['task']:<28} reward={d['reward']}  {verdict}")
    if json_out:
        typer.echo(json.dumps(summary | {"backend": backend}))
    else:
        typer.echo(f"{summary['defeated']}/{summary['hacks']} hacks defeated")
    if summary["defeated"] != summary["hacks"]:
        raise typer.Exit(1)
