"""The refusal: what does not fit and which one setting would make it fit.

Why search instead of a rule: the part that overflows depends on the config (activations for a
long context, the fp64 all-reduce copy for FSDP2 ranks, the accumulators for many open groups on
the host), so each knob is tried on its own, through the same plan, and only settings that make
the whole plan fit are offered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from thundersync.config import AccumDevice, Objective, RunConfig
from thundersync.config_serving import DeltaPublish
from thundersync.plan.memory import Machine, MemoryPlan, plan_memory
from thundersync.plan.parts import keep_turn_graphs
from thundersync.plan.shape import ModelShape


def _with(cfg: RunConfig, key: str, value: Any) -> RunConfig | None:
    from thundersync.config import ConfigError, load_run_config

    try:
        return load_run_config(data=cfg.model_dump(mode="json"), overrides={key: value})
    except (ConfigError, ValueError):
        return None


def _fits(cfg: RunConfig, key: str, value: Any, shape: ModelShape, machine: Machine) -> bool:
    other = _with(cfg, key, value)
    return other is not None and plan_memory(other, shape, machine).fits


def _largest(
    cfg: RunConfig, key: str, lo: int, hi: int, shape: ModelShape, m: Machine
) -> int | None:
    """The largest int in [lo, hi] with which the plan fits (the bytes grow with it)."""
    if lo > hi or not _fits(cfg, key, lo, shape, m):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _fits(cfg, key, mid, shape, m) else (lo, mid - 1)
    return lo


def _segment_tokens(cfg: RunConfig, shape: ModelShape, m: Machine) -> int | None:
    """The largest OPD segment (`learner.opd_segment_tokens`, below today's) that fits. With
    recomputed turn graphs the bytes grow with S (bisect); kept graphs are one per segment, so
    there a smaller S also costs: the largest power of two that fits."""
    key, hi = "learner.opd_segment_tokens", (cfg.learner.opd_segment_tokens or 0) - 1
    if hi < 1:
        hi = cfg.rollout.max_total_tokens - 1
    if not keep_turn_graphs(cfg, m.gpus > 0 and cfg.learner.device != "cpu"):
        return _largest(cfg, key, 1, hi, shape, m)
    tries = [hi] + [1 << i for i in reversed(range(hi.bit_length())) if 1 << i < hi]
    return next((v for v in tries if _fits(cfg, key, v, shape, m)), None)


def _switches(cfg: RunConfig) -> Iterator[tuple[str, Any]]:
    lc = cfg.learner
    for mode in ("segment", "layer"):
        if lc.activation_checkpointing == "none" or (
            lc.activation_checkpointing == "segment" and mode == "layer"
        ):
            yield "learner.activation_checkpointing", mode
    if lc.accum_device is AccumDevice.DEVICE:
        yield "learner.accum_device", "host"
    if lc.accum_dtype == "float64":
        yield "learner.accum_dtype", "float32"
    if cfg.model.dtype != "bfloat16":
        yield "model.dtype", "bfloat16"
    if lc.optimizer_device != "host":
        yield "learner.optimizer_device", "host"
    if cfg.publish.delta is not DeltaPublish.OFF:
        if cfg.publish.delta_base != "host":
            yield "publish.delta_base", "host"
        yield "publish.delta", "off"
    if cfg.publish.keep_last > 1:
        yield "publish.keep_last", 1


def fitting_changes(cfg: RunConfig, shape: ModelShape, machine: Machine) -> list[str]:
    """`key=value` settings, each of which alone makes the plan fit (the mildest per knob)."""
    out = []
    lc = cfg.learner
    ints = [
        ("learner.max_open_groups", 1, lc.max_open_groups - 1),
        ("rollout.max_total_tokens", 2, cfg.rollout.max_total_tokens - 1),
        ("learner.ranks", 1, lc.ranks - 1),  # fewer ranks on this host
    ]
    for key, lo, hi in ints:
        best = _largest(cfg, key, lo, hi, shape, machine)
        if best is not None:
            out.append(f"{key}={best}")
    if cfg.objective is Objective.OPD:
        best = _segment_tokens(cfg, shape, machine)
        if best is not None:
            out.append(f"learner.opd_segment_tokens={best}")
    for key, value in _switches(cfg):
        if _fits(cfg, key, value, shape, machine):
            out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


_KNOB = {
    "activations: one OPD": "learner.opd_segment_tokens, learner.activation_checkpointing",
    "activations": "rollout.max_total_tokens, learner.activation_checkpointing",
    "GRPO prompt": "learner.max_open_groups, learner.activation_checkpointing",
    "accumulators": "learner.max_open_groups, learner.accum_dtype",
    "OPD K/V": "learner.max_open_groups, rollout.max_total_tokens",
    "OPD past-leaf": "rollout.max_total_tokens",
    "OPD kept": "learner.opd_turn_graphs, learner.max_open_groups",
    "update sum": "learner.accum_dtype",
    "/dev/shm": "publish.keep_last",
    "delta": "publish.delta_base, publish.delta",
    "FSDP2 master": "learner.optimizer_device",
    "master weights": "learner.optimizer_device",
    "AdamW": "learner.optimizer_device",
}


def _knob(name: str) -> str:
    return next((k for p, k in _KNOB.items() if name.startswith(p)), "no setting")


def refuse(plan: MemoryPlan, cfg: RunConfig) -> str | None:
    """None when the plan fits; else the message: what overflows, by how much, and the knobs."""
    over = plan.overflow()
    if not over:
        return None
    shape, machine = plan.shape, plan.machine
    msg = f"the memory plan for {shape.name} does not fit: " + "; ".join(over)
    if machine.gpus and plan.gpus_needed > machine.gpus:
        return msg + (
            f". Pass --gpus {plan.gpus_needed} (a machine with that many) or lower "
            "learner.ranks / rollout.replicas / placement.*_gpus"
        )
    fixes = fitting_changes(cfg, shape, machine)
    if fixes:
        return msg + ". It fits with any one of: " + ", ".join(fixes) + " (--set key=value)"
    where = "gpu" if any(o.startswith("a learner GPU") for o in over) else "host"
    phase = plan.peak_phase(where)
    held = (c for c in plan.components if c.where == where and c.phase in ("static", phase))
    big = sorted(held, key=lambda c: -c.bytes)[:3]
    parts = ", ".join(f"{c.name} {c.bytes / 1e9:.1f} GB ({_knob(c.name)})" for c in big)
    return msg + (
        f". No single setting makes it fit; the largest {where} parts at its peak: {parts}. Use larger "
        "GPUs / more host memory, model.lora_rank, or a smaller model (more --gpus with "
        "learner.ranks shards only the optimizer: every rank holds the whole model)"
    )
