"""`tsrl teacher serve` / `tsrl teacher check`: run the vLLM scoring server, verify a backend."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import app

teacher_app = typer.Typer(
    no_args_is_help=True, help="Teacher scoring server (vLLM prompt_logprobs)."
)
app.add_typer(teacher_app, name="teacher")


@teacher_app.command("serve")
def serve(
    model: str = typer.Option(
        ..., "--model", help="HF model directory (untied embeddings for reloads)"
    ),
    port: int = typer.Option(0, help="0 picks a free loopback port"),
    dtype: str = typer.Option("float32"),
    kv_cache_gib: int = typer.Option(1, help="VLLM_CPU_KVCACHE_SPACE"),
    host: str = typer.Option("127.0.0.1", help="bind address (0.0.0.0 to serve other hosts)"),
    gpu_memory_utilization: float = typer.Option(
        None, help="vLLM --gpu-memory-utilization (GPU builds; lets two engines share a GPU)"
    ),
) -> None:
    """Start a vLLM OpenAI-compatible server on MODEL and keep it up until Ctrl-C."""
    import time

    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError

    extra = []
    if gpu_memory_utilization is not None:
        extra = ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    cfg = VLLMServerConfig(
        model=model,
        port=port or None,
        dtype=dtype,
        kv_cache_gib=kv_cache_gib,
        host=host,
        extra_args=extra,
    )
    server = VLLMServer(cfg)
    try:
        server.start()
    except VLLMServerError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"url": server.url, "model": model, "log": str(server.log_path)}))
    try:
        while server.is_healthy(timeout_s=10):
            time.sleep(5)
        typer.echo(
            f"server stopped answering; log {server.log_path}:\n{server.log_tail()}", err=True
        )
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@teacher_app.command("check")
def check(
    backend: str = typer.Option("vllm", help="vllm | hf"),
    model: str = typer.Option(None, "--model", help="model directory (default: a tiny model)"),
    as_json: bool = typer.Option(False, "--json", help="last line is the JSON result"),
) -> None:
    """Score token ids on the backend vs HF, take one learner step, publish, compare again."""
    from rich.console import Console
    from rich.table import Table

    from thundersync.teacher.check import GOAL, run_check

    res = run_check(backend, model)
    table = Table(title=f"teacher check ({backend})")
    table.add_column("metric")
    table.add_column("value")
    for k, v in res.items():
        table.add_row(k, f"{v:.3g}" if isinstance(v, float) else str(v))
    Console(stderr=as_json).print(table)
    if as_json:
        typer.echo(json.dumps(res))
    ok = res["reload_ok"] and res["max_abs_logprob_diff"] <= GOAL
    raise typer.Exit(0 if ok else 1)
