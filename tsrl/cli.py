"""`tsrl`: the command-line entry point.

Each package contributes its commands through `<package>/commands.py:register(app)`, so a package
owns its CLI surface and this file stays a short list.
"""

from __future__ import annotations

import importlib
import json

import typer

from tsrl.config import ConfigError, RunConfig, load_run_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="ThunderSync training service")
model_app = typer.Typer(no_args_is_help=True, help="Build models (no hub access needed).")
config_app = typer.Typer(no_args_is_help=True, help="Inspect and validate run configs.")
app.add_typer(model_app, name="model")
app.add_typer(config_app, name="config")


@model_app.command("tiny")
def model_tiny(
    out_dir: str,
    seed: int = typer.Option(0, help="weights seed"),
    hidden: int = typer.Option(64),
    layers: int = typer.Option(2),
    tokenizer_from: str = typer.Option(None, help="reuse this model's tokenizer (OPD students)"),
) -> None:
    """A deterministic tiny Llama-style causal LM with a locally trained BPE tokenizer."""
    from tsrl.models import build_tiny_model, load_tokenizer

    tok = load_tokenizer(tokenizer_from) if tokenizer_from else None
    path = build_tiny_model(out_dir, seed=seed, hidden=hidden, layers=layers, tokenizer=tok)
    typer.echo(str(path))


@config_app.command("show")
def config_show(recipe: str, set_: list[str] = typer.Option([], "--set", help="key=value")) -> None:
    """Print the resolved config of a recipe (with --set overrides) as JSON."""
    overrides = {}
    for kv in set_:
        k, _, v = kv.partition("=")
        overrides[k] = json.loads(v) if v[:1] in "[{0123456789-tfn" and v not in ("-",) else v
    try:
        cfg = load_run_config(recipe, overrides)
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(cfg.model_dump_json(indent=2))


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON schema of the run config."""
    typer.echo(json.dumps(RunConfig.model_json_schema(), indent=2))


_COMMAND_MODULES = [
    "learner.commands",
    "bench.commands",
    "sandbox.commands",
    "rollout.commands",
    "teacher.commands",
    "bus.commands",
    "service.commands",
]

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _e:
        if _e.name != _name:
            raise
        continue
    _mod.register(app)


if __name__ == "__main__":
    app()
