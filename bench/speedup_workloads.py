"""The speedup bench's workloads (`WORKLOADS`) and the run config of one (`workload_config`):
what `bench.speedup` measures, `bench.balance` probes and `bench.time_to_target` trains.
"""

from __future__ import annotations

from typing import Any

from thundersync.config import RunConfig, load_run_config

WORKLOADS: dict[str, dict[str, Any]] = {
    # balanced: rollout time (generation + a sandbox tool call per trajectory) close to learner
    # time. The width is each workload's starting point: `bench.balance` re-chooses it on the
    # machine that runs the bench (--no-balance keeps it). Eight groups per update make the
    # per-update costs streaming cannot hide (the first source's latency, the last source's
    # work, the publish) a small share of the step, as in real runs with hundreds of rollouts.
    "grpo": {
        "objective": "grpo",
        # wide and shallow: the learner's cost grows with hidden^2, a decode step's mostly with
        # the layer count, so the width balances the learner against generation; a sandbox
        # tool call per trajectory (its wait, not CPU) is the rest of the rollout, as in
        # agentic RL, and keeps the two busy cores from overlapping for the whole step
        "model.tiny_hidden": 1280,
        "model.tiny_layers": 2,
        # no recompute in backward: it balances the workload at a smaller width (session 14:
        # bound 1.90 at 1440) but measured efficiency 0.88, against 0.935 the same day without
        # it (width 1920, L/R 0.87); without it `balance` still reaches L/R ~1 where the VM
        # allows (session 15: width 1920, L/R 0.98, 1.87x of 1.95, efficiency 0.96)
        "rollout.groups_per_update": 8,
        "rollout.group_size": 8,
        "rollout.max_turns": 2,
        "rollout.max_new_tokens": 6,
        "rollout.concurrency": 2,
        "env.tool_seconds": 0.1,
        "learner.max_open_groups": 4,
        # fp32 accumulators (the default): float64 ones doubled the learner's flat-vector
        # traffic, which then competed with decode for memory bandwidth (learner 1.07-1.23x
        # slower when overlapped) and made L 1.5x longer for no exactness gain here (stream
        # and sync sum the same sources in the same order)
        "optim.lr": 0.003,
    },
    "opd": {
        "objective": "opd",
        "model.tiny_hidden": 1024,
        "model.tiny_layers": 2,
        "rollout.groups_per_update": 8,
        "rollout.group_size": 4,
        "rollout.max_turns": 3,
        "rollout.max_new_tokens": 8,
        "rollout.concurrency": 2,
        "env.tool_seconds": 0.2,
        "learner.max_open_groups": 2,
        # a trajectory sums its own turns in turn order, so fp32 is already order-independent
        "learner.accum_dtype": "float32",
        "optim.lr": 0.003,
    },
}


def workload_config(objective: str, schedule: str, updates: int, **extra: Any) -> RunConfig:
    if objective not in WORKLOADS:
        raise ValueError(f"--objective {objective!r}: use one of {sorted(WORKLOADS)}")
    over = WORKLOADS[objective] | {
        "updates": updates,
        "schedule": schedule,
        "name": f"speedup-{objective}",
    }
    return load_run_config(data={}, overrides=over | extra)
