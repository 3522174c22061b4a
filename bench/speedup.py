"""`tsrl bench speedup`: the same workload under `sync` and `stream`, measured in one invocation.

Each round runs a short training run per schedule from the same theta_0 with the same seeds and
tasks (real agent loop, real bubblewrap tool calls, learner in its own process), sync and stream
alternating so that machine drift hits both alike. Per-update numbers come from the run
directories; update 0 (first-call warm-up) is left out. The rollout side and the learner are
pinned to different cores (see `placement`). `max_param_gap` replays every stream run's logged
batches through `sync` from theta_0 and compares with the parameters the run published.
`load` > 0 runs that many cores of fixed background CPU load (`bench.load`) during every run, so
the speedup's robustness to other work on the machine is measured too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from thundersync.bench.speedup_stats import median, schedule_summary, spread
from thundersync.bench.speedup_workloads import WORKLOADS, workload_config
from thundersync.rundir import RunFiles


def prediction_errors(runs: dict[str, list[RunFiles]], machine_slowdown: float) -> dict[str, Any]:
    """`tsrl predict` on each round: the stream steps predicted from the sync run's spans (update
    0 left out) against the stream run of the same round, without contention and with the
    machine's (`bench.machine_contention`, measured apart from the runs) on both sides.

    `rel_error` is each round's error of the run's mean step; `rel_error_per_update` pairs single
    updates and so includes their machine noise, which `noise_per_update` measures on its own:
    the same update of consecutive rounds' sync runs (same tokens, same work) differs by that
    much."""
    from thundersync.bench.predict import Contention, check, load_trace, predict, summary

    plain: list[float] = []
    per_update: list[float] = []
    machine: list[float] = []
    reachable: list[float] = []
    for a, b in zip(runs["sync"], runs["stream"], strict=True):
        sync = [u for u in load_trace(a.root) if u.update > 0]
        stream = [u for u in load_trace(b.root) if u.update > 0]
        preds = predict(sync)  # without contention: checked, and the reachable speedup
        res = check(preds, stream)
        plain.append(res["rel_error"])
        per_update.append(res.get("rel_error_per_update", res["rel_error"]))
        c = Contention(machine_slowdown, machine_slowdown)
        machine.append(check(predict(sync, c), stream)["rel_error"])
        reachable.append(summary(preds)["predicted_speedup"])
    noise: list[float] = []
    for a, b in zip(runs["sync"], runs["sync"][1:], strict=False):
        steps = {m["update"]: m["step_s"] for m in b.read_metrics()[1:]}
        noise += [
            abs(m["step_s"] - steps[m["update"]]) / steps[m["update"]]
            for m in a.read_metrics()[1:]
            if m["update"] in steps
        ]
    return {
        "rel_error": spread(plain),
        "rel_error_per_update": spread(per_update),
        "noise_per_update": spread(noise),
        "rel_error_with_machine_contention": spread(machine),
        "machine_slowdown": machine_slowdown,
        # the sync trace's own items replayed as stream without contention: what the bound
        # leaves out (the learner cannot start before the first source is ready, nor finish
        # before the last one's work is done) but nothing of the overlap's cost
        "predicted_speedup": spread(reachable),
    }


def run_speedup(
    objective: str,
    rounds: int = 2,
    updates: int = 4,
    out: Path | None = None,
    load: float = 0.0,
    overrides: dict[str, Any] | None = None,
    balance: bool = True,
) -> dict[str, Any]:
    from thundersync.bench.balance import balance_width, sync_probe
    from thundersync.bench.load import BackgroundLoad
    from thundersync.bench.machine_contention import measure
    from thundersync.driver.replay_gap import replay_gap
    from thundersync.driver.run import RunDriver

    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="tsrl-speedup-"))
    overrides = dict(overrides or {})
    balanced: dict[str, Any] = {}
    if balance and "model.tiny_hidden" not in overrides:  # a width set by hand is kept
        h0 = int(WORKLOADS[objective]["model.tiny_hidden"])
        probe = sync_probe(objective, overrides, load, updates, root / "balance")
        balanced = balance_width(h0, probe)
        overrides["model.tiny_hidden"] = balanced["width"]
    with BackgroundLoad(load):  # the hardware's share of `contention`, under the same load
        machine = measure()
    runs: dict[str, list[RunFiles]] = {"sync": [], "stream": []}
    load_got: dict[str, list[float]] = {"sync": [], "stream": []}
    gaps: list[float] = []
    placement = ""
    for r in range(rounds):
        for schedule in ("sync", "stream"):
            cfg = workload_config(objective, schedule, updates, **overrides)
            rd = RunFiles(root / f"{schedule}-r{r}")
            with BackgroundLoad(load) as bg:  # the replay below runs without it
                RunDriver(cfg, rd.root, log_batches=schedule == "stream").run()
            if bg.cores_obtained is not None:
                load_got[schedule].append(bg.cores_obtained)
            runs[schedule].append(rd)
            placement = next((x for x in rd.log_lines() if "placement" in x), "")
            if schedule == "stream":
                gaps += replay_gap(rd.root, cfg, rd.model)
    sync, stream = (
        [m for rd in runs[k] for m in rd.read_metrics()[1:]] for k in ("sync", "stream")
    )
    per_sched = {k: schedule_summary(v) for k, v in runs.items()}
    R, L, P = (per_sched["sync"][k] for k in ("R", "L", "P"))
    sync_s, stream_s = median([m["step_s"] for m in sync]), median([m["step_s"] for m in stream])
    # paired per round (sync r and stream r ran back to back): machine drift cancels
    rounds_speedup = [
        median([m["step_s"] for m in a.read_metrics()[1:]])
        / median([m["step_s"] for m in b.read_metrics()[1:]])
        for a, b in zip(runs["sync"], runs["stream"], strict=True)
    ]
    speedup = median(rounds_speedup)
    bound_sync = per_sched["sync"]["bound"]
    pred = prediction_errors(runs, machine.get("slowdown_mean", 1.0))
    return {
        "objective": objective,
        "sync_step_s": sync_s,
        "stream_step_s": stream_s,
        "speedup": speedup,
        "R": R,
        "L": L,
        "P": P,
        "bound": bound_sync,
        "efficiency": speedup / bound_sync,
        "speedup_rounds": spread(rounds_speedup),
        "bound_stream": per_sched["stream"]["bound"],
        "efficiency_vs_stream_bound": speedup / per_sched["stream"]["bound"],
        "schedules": per_sched,
        # what overlap costs each side (both on a shared machine: caches, memory bandwidth)
        "machine_contention": machine,
        "prediction": pred,
        # speedup = bound x structural (first source ready late, last work after the rollout
        # closed: the release model on sync's own items) x overlap (contention, drift)
        "structural_efficiency": pred["predicted_speedup"]["median"] / bound_sync,
        "overlap_efficiency": speedup / pred["predicted_speedup"]["median"],
        "contention": {
            k: per_sched["stream"][k] / per_sched["sync"][k] if per_sched["sync"][k] else 0.0
            for k in ("R", "L", "P")
        },
        "idle_share_sync": median([m["idle_share"] for m in sync]),
        "idle_share_stream": median([m["idle_share"] for m in stream]),
        "peak_rss_ratio": max(m["learner_peak_rss_mb"] for m in stream)
        / max(m["learner_peak_rss_mb"] for m in sync),
        "max_param_gap": max(gaps) if gaps else float("nan"),
        "bus_p99_ms": max(m["bus_p99_ms"] for m in stream),
        "ready_to_recv_p99_ms": max(m["ready_to_recv_p99_ms"] for m in stream),
        "updates_measured": {"sync": len(sync), "stream": len(stream)},
        "placement": placement.split("placement: ", 1)[-1],
        "load_cores": load,
        # what the load really got while each schedule ran (its CPU seconds / the run's wall
        # time): the cores it took are the ones the schedule's processes did not have
        "load_cores_obtained": {k: spread(v) for k, v in load_got.items() if v},
        "overrides": overrides,
        # the width chosen by the sync probes (empty: --no-balance or a width set by --set)
        "balance": balanced,
        "run_dirs": str(root),
    }
