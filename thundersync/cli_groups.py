"""Command groups shared by several packages (e.g. `tsrl bench ...` has commands from learner/,
bench/ and bus/). A package's `cli_*.py` module imports the group it extends from here."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="ThunderSync training service")
model_app = typer.Typer(no_args_is_help=True, help="Build models (no hub access needed).")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each prints JSON with --json.")
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")
