"""`tsrl teacher serve` / `tsrl teacher check`: run the vLLM scoring server, verify a backend."""

from __future__ import annotations

import json
from dataclasses import replace

import typer

from thundersync.cli_groups import app
from thundersync.config import Device, VLLMDtype

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
    host: str = typer.Option("127.0.0.1", help="bind address (0.0.0.0 to serve other hosts)"),
    device: Device = typer.Option(
        Device.AUTO, help="auto: cuda when the vLLM venv sees a GPU; picks the defaults below"
    ),
    dtype: VLLMDtype = typer.Option(None, help="unset: bfloat16 on cuda, float32 on cpu"),
    max_model_len: int = typer.Option(
        None,
        min=16,
        help="context (tokens) to serve, at least the runs' rollout.max_total_tokens; "
        "unset: the model's own",
    ),
    tensor_parallel_size: int = typer.Option(1, min=1, help="GPUs of this server"),
    enforce_eager: bool = typer.Option(
        None, "--enforce-eager/--no-enforce-eager", help="unset: eager on cpu only (CUDA graphs)"
    ),
    enable_prefix_caching: bool = typer.Option(
        True, "--enable-prefix-caching/--no-enable-prefix-caching"
    ),
    enable_chunked_prefill: bool = typer.Option(
        True, "--enable-chunked-prefill/--no-enable-chunked-prefill"
    ),
    gpu_memory_utilization: float = typer.Option(
        0.85, min=0.01, max=1.0, help="cuda only (lets two engines share a GPU)"
    ),
    kv_cache_gib: int = typer.Option(1, min=1, help="cpu only: VLLM_CPU_KVCACHE_SPACE"),
) -> None:
    """Start a vLLM OpenAI-compatible server on MODEL and keep it up until Ctrl-C. The settings
    a run would give its teacher (`teacher.vllm`), resolved for the device."""
    import time

    from thundersync.config import TeacherVLLMSettings
    from thundersync.rollout.engine_settings import engine_server_config
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerError, engine_on_gpu

    settings = TeacherVLLMSettings(
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        enable_prefix_caching=enable_prefix_caching,
        enable_chunked_prefill=enable_chunked_prefill,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_gib=kv_cache_gib,
    )
    on_gpu = engine_on_gpu() if device is Device.AUTO else device is Device.CUDA
    sc = engine_server_config(
        settings,
        model,
        on_gpu=on_gpu,
        context=None,
        tensor_parallel_size=tensor_parallel_size,
        model_dtype="float32",
        field="teacher.vllm",
    )
    cfg = replace(sc, port=port or None, host=host)
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
