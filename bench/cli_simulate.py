"""`tsrl bench simulate` (release-model trends, table + plots + JSON) and `tsrl predict TRACE`
(stream step time predicted from a sync run's spans)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from thundersync.cli_groups import app, bench_app


@bench_app.command("simulate")
def bench_simulate(
    out: Path = typer.Option(Path("runs/simulate"), help="directory for the PNG plots"),
    seed: int = typer.Option(0),
    samples: int = typer.Option(12, help="sampled updates per point"),
    as_json: bool = typer.Option(False, "--json", help="last line: JSON summary"),
) -> None:
    """Simulate sync / group / stream on GRPO and OPD workloads; check the closed forms and bound."""
    from thundersync.bench import sweeps

    res = sweeps.run(seed=seed, samples=samples)
    typer.echo(f"{'trend':<28} {'x':>6} {'simulated':>10} {'closed form':>12}")
    for r in res.rows:
        closed = r["closed"]
        c = f"{closed:12.3f}" if isinstance(closed, float) else f"{'-':>12}"
        typer.echo(f"{r['trend']!s:<28} {float(r['x']):6.2f} {float(r['des']):10.3f} {c}")  # type: ignore[arg-type]
    plots = _plots(res, out)
    summary = sweeps.summary(res)
    summary["plots"] = [str(p) for p in plots]
    if as_json:
        typer.echo(json.dumps(summary))


def _plots(res: object, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from thundersync.bench import release_models as rm
    from thundersync.bench.sweeps import SweepResults

    assert isinstance(res, SweepResults)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(2, 2, figsize=(10, 8))
    h, s = zip(*res.het, strict=True)
    ax[0, 0].plot(h, s, "o-")
    ax[0, 0].set(xlabel="duration dispersion h", ylabel="speedup", title="GRPO vs dispersion")
    w, sd, sc = zip(*res.waves, strict=True)
    ax[0, 1].semilogx(w, sd, "o-", label="simulated")
    ax[0, 1].semilogx(w, sc, "--", label="closed form")
    ax[0, 1].axhline(2.0, color="gray", lw=0.5)
    ax[0, 1].set(xlabel="rollout waves w", ylabel="speedup", title="waves")
    ax[0, 1].legend()
    rho, g, o, b = zip(*res.rho_curve, strict=True)
    ax[1, 0].plot(rho, g, "o-", label="GRPO")
    ax[1, 0].plot(rho, o, "s-", label="OPD")
    ax[1, 0].plot(rho, b, "--", label="bound")
    ax[1, 0].set(xlabel="rho = L / R", ylabel="speedup", title="GRPO vs OPD")
    ax[1, 0].legend()
    u = rm.GRID
    for name, F in [
        ("GRPO b=0.1 g=1 m=8", rm.grpo_release(0.1, 1.0, 8)),
        ("OPD a=4 d=0.1", rm.opd_release(4, 0.1, 1.0)),
        ("GRPO, 4 waves", rm.waved(rm.grpo_release(0.1, 1.0, 8), 4)),
    ]:
        ax[1, 1].plot(u, F(u), label=name)
    ax[1, 1].plot(u, np.asarray(u), ":", color="gray", label="uniform")
    ax[1, 1].set(xlabel="u = t / R", ylabel="F(u)", title="released-service fraction")
    ax[1, 1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "simulate.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


@app.command("predict")
def predict_cmd(
    trace: Path = typer.Argument(..., help="sync run directory or its spans.jsonl"),
    against: Path = typer.Option(None, help="stream run (dir or spans.jsonl) to check against"),
    contention_rollout: float = typer.Option(
        1.0, min=0.1, help="stream/sync ratio of R under overlap (1: none; see the bench's)"
    ),
    contention_learner: float = typer.Option(
        1.0, min=0.1, help="stream/sync ratio of learner item time while rollouts run"
    ),
    as_json: bool = typer.Option(False, "--json", help="last line: JSON summary"),
) -> None:
    """Predict the stream step time and speedup from a sync run's recorded spans."""
    from thundersync.bench.predict import (
        Contention,
        TraceError,
        check,
        load_trace,
        predict,
        summary,
    )

    try:
        updates = load_trace(trace)
        preds = predict(updates, Contention(contention_rollout, contention_learner))
        result = summary(preds)
        stream = [u for u in updates if u.schedule == "stream"]
        if against is not None:
            stream += load_trace(against)
        if stream:
            result["check"] = check(preds, stream, updates)
    except TraceError as e:
        typer.echo(f"cannot predict: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{'update':>6} {'sync_s':>9} {'stream_s(pred)':>15} {'speedup':>8} {'bound':>6}")
    for p in preds:
        typer.echo(
            f"{p.update:6d} {p.sync_step_s:9.3f} {p.stream_step_s:15.3f} {p.speedup:8.3f} {p.bound:6.3f}"
        )
    if "check" in result:
        c = result["check"]
        typer.echo(
            f"measured stream {c['measured_stream_step_s']:.3f} s, predicted "
            f"{c['predicted_stream_step_s']:.3f} s, error {100 * c['rel_error']:.1f}%"
        )
    if as_json:
        result.pop("per_update")
        typer.echo(json.dumps(result))
