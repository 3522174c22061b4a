"""`tsrl`: the command-line entry point.

Each package contributes commands from its own `cli_*.py` modules (discovered below), which add to
`thundersync.cli_groups.app` or to a shared group such as `bench_app`. A package owns its CLI surface, and
this file never needs editing when one is added.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import typer

import thundersync.cli_data  # noqa: F401  (registers `tsrl data`)
from thundersync.cli_groups import app, model_app
from thundersync.config import Arch, ConfigError, RunConfig, load_run_config, parse_set_overrides

config_app = typer.Typer(no_args_is_help=True, help="Inspect and validate run configs.")
app.add_typer(config_app, name="config")


@model_app.command("tiny")
def model_tiny(
    out_dir: str,
    seed: int = typer.Option(0, help="weights seed"),
    hidden: int = typer.Option(64),
    layers: int = typer.Option(2),
    tokenizer_from: str = typer.Option(None, help="reuse this model's tokenizer (OPD students)"),
    arch: Arch = typer.Option(Arch.LLAMA, help="model family: llama | qwen2 | qwen3"),
) -> None:
    """A deterministic tiny causal LM (--arch) with a locally trained BPE tokenizer."""
    from thundersync.hf_models import build_tiny_model, load_tokenizer

    tok = load_tokenizer(tokenizer_from) if tokenizer_from else None
    path = build_tiny_model(
        out_dir, seed=seed, hidden=hidden, layers=layers, tokenizer=tok, arch=arch
    )
    typer.echo(str(path))


@config_app.command("show")
def config_show(recipe: str, set_: list[str] = typer.Option([], "--set", help="key=value")) -> None:
    """Print the resolved config of a recipe (with --set overrides) as JSON."""
    try:
        cfg = load_run_config(recipe, parse_set_overrides(set_))
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(cfg.model_dump_json(indent=2))


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON schema of the run config."""
    typer.echo(json.dumps(RunConfig.model_json_schema(), indent=2))


_PACKAGES = [
    "learner",
    "bench",
    "sandbox",
    "rollout",
    "teacher",
    "bus",
    "service",
    "driver",
    "skyrl",
    "plan",
]
_ROOT = Path(__file__).parent  # the package itself: a checkout links the parts in


def _discover() -> None:
    for pkg in _PACKAGES:
        for info in pkgutil.iter_modules([str(_ROOT / pkg)]):
            if info.name.startswith("cli_"):
                importlib.import_module(f"thundersync.{pkg}.{info.name}")


_discover()

if __name__ == "__main__":
    app()
