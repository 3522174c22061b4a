"""`tsrl bench publish`: the disk path vs the in-memory path for a policy update."""

from __future__ import annotations

import json

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
    as_json: bool = typer.Option(False, "--json", help="last line: one JSON object"),
) -> None:
    """Seconds and GB/s per weight update, disk vs shared memory, on real vLLM replicas."""
    from thundersync.bench.weight_transport import run_weight_transport_bench

    bad = [m for m in model if m not in ("tiny", "smollm2")]
    if bad:
        raise typer.BadParameter(f"--model {bad[0]!r}: use tiny or smollm2")
    if cpu_weights not in ("map", "packed"):
        raise typer.BadParameter(f"--cpu-weights {cpu_weights!r}: use map or packed")
    res = run_weight_transport_bench(
        tuple(model), rounds, tuple(sorted(set(replicas))), cpu_weights
    )
    if as_json:
        for row in res["rows"]:
            print(json.dumps(row))
        print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
        return
    for row in res["rows"]:
        print(row)
    print(
        f"speedup_vs_disk {res['speedup_vs_disk']}  answers_new_weights {res['answers_new_weights']}"
    )
