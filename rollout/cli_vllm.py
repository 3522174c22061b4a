"""`tsrl vllm serve`: rollout vLLM servers kept up across runs, which attach to them with
`--set rollout.vllm.urls=[...]` instead of starting their own (rollout/vllm_attach.py)."""

from __future__ import annotations

import json

import typer

from thundersync.cli_groups import app
from thundersync.config import Device, VLLMDtype

vllm_app = typer.Typer(no_args_is_help=True, help="vLLM rollout servers that runs attach to.")
app.add_typer(vllm_app, name="vllm")


@vllm_app.command("serve")
def serve(
    model: str = typer.Option(
        "tiny",
        "--model",
        help="HF model directory, 'tiny' (the tiny model a vLLM run builds) or 'smollm2'",
    ),
    replicas: int = typer.Option(1, min=1, help="servers to start (in parallel)"),
    port: int = typer.Option(0, help="the first server's port (then +1 each); 0: free ports"),
    host: str = typer.Option("127.0.0.1", help="bind address (shm weights need the same host)"),
    config: str = typer.Option(None, "--config", help="recipe whose rollout.vllm settings to use"),
    set_: list[str] = typer.Option([], "--set", help="key=value, e.g. rollout.vllm.kv_cache_gib=2"),
    device: Device = typer.Option(
        Device.AUTO, help="auto: cuda when the vLLM venv sees a GPU; picks the unset settings"
    ),
    max_model_len: int = typer.Option(
        None, min=16, help="rollout.vllm.max_model_len: at least the runs' rollout.max_total_tokens"
    ),
    dtype: VLLMDtype = typer.Option(None, help="rollout.vllm.dtype (unset: bfloat16 on cuda)"),
    tensor_parallel_size: int = typer.Option(None, min=1, help="rollout.vllm.tensor_parallel_size"),
    enforce_eager: bool = typer.Option(
        None, "--enforce-eager/--no-enforce-eager", help="rollout.vllm.enforce_eager"
    ),
) -> None:
    """Start REPLICAS vLLM servers as `tsrl train` would (worker extension, rollout.vllm settings
    resolved for the device), print their URLs as one JSON line and keep them up until Ctrl-C.
    The flags are shorthands for `--set rollout.vllm.X=...`."""
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace
    from pathlib import Path

    from thundersync.config import ConfigError, load_run_config, parse_set_overrides
    from thundersync.driver.vllm_replicas import replica_server_config
    from thundersync.rollout.engine_settings import EngineSettingsError
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerError, engine_on_gpu

    flags = {
        "max_model_len": max_model_len,
        "dtype": dtype,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": enforce_eager,
    }
    try:
        overrides = {"rollout.engine": "vllm", **parse_set_overrides(set_)}
        overrides |= {f"rollout.vllm.{k}": v for k, v in flags.items() if v is not None}
        cfg = load_run_config(config, overrides)
    except ConfigError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    if model == "tiny":
        from thundersync.hf_models import build_tiny_model

        m = cfg.model
        out = Path(tempfile.mkdtemp(prefix="tsrl-vllm-tiny-")) / "model"
        model = str(
            build_tiny_model(
                out, seed=m.tiny_seed, hidden=cfg.tiny_width, layers=m.tiny_layers, arch=m.tiny_arch
            )
        )
    elif model == "smollm2":  # the built-in policy (`model.path: smollm2`), from the cache
        from thundersync.smollm2 import smollm2_dir

        model = str(smollm2_dir())
    on_gpu = engine_on_gpu() if device is Device.AUTO else device is Device.CUDA
    try:
        sc = replica_server_config(cfg, model, on_gpu=on_gpu)
    except EngineSettingsError as e:
        typer.echo(f"invalid config: {e}", err=True)
        raise typer.Exit(2) from None
    servers = []
    for i in range(replicas):
        c = replace(sc, host=host, port=port + i if port else None)
        if host == "127.0.0.1":
            servers.append(VLLMServer(c))
        else:
            from thundersync.cluster.ray_servers import (
                NodeVLLMServer,  # its URL names the bound host
            )

            servers.append(NodeVLLMServer(c))
    try:
        with ThreadPoolExecutor(replicas) as pool:
            for f in [pool.submit(s.start) for s in servers]:
                f.result()
        urls = [s.url for s in servers]
        typer.echo(
            json.dumps(
                {
                    "urls": urls,
                    "model": model,
                    "logs": [str(s.log_path) for s in servers],
                    "set": f"rollout.vllm.urls={json.dumps(urls)}",
                }
            )
        )
        while not (down := [s for s in servers if not s.is_healthy(timeout_s=10)]):
            time.sleep(5)
        for s in down:
            typer.echo(f"{s.url} stopped answering; log {s.log_path}:\n{s.log_tail()}", err=True)
        raise typer.Exit(1)
    except VLLMServerError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
    finally:
        for s in servers:
            s.stop()
