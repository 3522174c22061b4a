"""`tsrl bench gpu [--device cuda] [--small] [--json]`."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("gpu")
def gpu(
    device: str = typer.Option("cuda", help="cuda (the point), or cpu to check the code path"),
    updates: int = typer.Option(4, min=1, help="equivalence updates per variant"),
    small: bool = typer.Option(False, help="a tiny model for the memory check (CPU runs)"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """The learner's CUDA path: equivalence fp32/bf16, determinism on/off, 0.5B memory."""
    from thundersync.bench.gpu_checks import run_gpu_checks

    res = run_gpu_checks(device, updates=updates, small=small)
    print(json.dumps(res) if as_json else json.dumps(res, indent=2))
    if not res["ok"]:
        raise typer.Exit(1)
