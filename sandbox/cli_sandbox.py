"""`tsrl sandbox ...`: sandbox backends' self-checks."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import app

sandbox_app = typer.Typer(no_args_is_help=True, help="Sandboxed tool executors.")
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("selftest")
def selftest(
    backend: str = typer.Option("local", help="local | docker"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    only: list[str] = typer.Option([], "--only", help="run just these attacks"),
) -> None:
    """Run the attack suite against a backend; exit 1 unless every attack is contained."""
    from thundersync.sandbox.backends import get_executor
    from thundersync.sandbox.executor import SandboxError
    from thundersync.sandbox.selftest import run_selftest

    try:
        report = run_selftest(get_executor(backend), only or None)
    except SandboxError as e:
        typer.echo(f"sandbox unavailable: {e}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(json.dumps(report))
    else:
        for d in report["details"]:  # type: ignore[attr-defined]
            mark = "contained" if d["contained"] else "NOT CONTAINED"
            typer.echo(f"{d['name']:<24} {mark:<14} {d['evidence']}")
        typer.echo(f"{report['contained']}/{report['attacks']} contained")
    if report["contained"] != report["attacks"]:
        raise typer.Exit(1)
