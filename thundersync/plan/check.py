"""`tsrl bench plan-check`: the plan's bytes against real ones.

Measured (CPU, real allocations of the real learner, small models): the engine's pooled vectors
at their peak (`BufferPool.peak_held_bytes`: G1/G2, trajectory sums, the update's sum, OPD K/V
stores) in a GRPO update and an OPD update driven so the plan's worst case is reached (open
groups at the cap while the update's sum holds two parts; a K/V store grown to its limit T);
the AdamW moments and master copy after the step; the LM head's routing scratch; the bytes
autograd saves for one segment with and without past (saved-tensor hooks, parameters excluded).
Counted (meta device, no memory): the 8B / 32B shapes' real parameter tensors against the plan's
weights / master / AdamW / accumulator / shm-slot bytes. What is not checked here: GPU-only
transients (the NCCL fp64 copy, FSDP2 shards, the head's dW on CUDA) are read from the code.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from thundersync.plan import activations as act
from thundersync.plan.memory import Machine, plan_memory
from thundersync.plan.shape import SHAPES_DIR, ModelShape, load_shape

_FAR = Machine(0, None, 1 << 60)


def _row(case: str, component: str, how: str, measured: int, planned: int) -> dict[str, Any]:
    err = abs(measured - planned) / max(measured, 1)
    return {
        "case": case,
        "component": component,
        "how": how,
        "measured": int(measured),
        "planned": int(planned),
        "rel_err": err,
    }


def _planned(plan: Any, prefix: str) -> int:
    return sum(c.bytes for c in plan.components if c.name.startswith(prefix))


def _cfg(objective: str, dtype: str, k: int, tokens: int, **learner: Any) -> Any:
    from thundersync.config import load_run_config

    return load_run_config(
        data={
            "objective": objective,
            "model": {"dtype": dtype},
            "learner": {"max_open_groups": k, "device": "cpu", **learner},
            "rollout": {"max_total_tokens": tokens},
        }
    )


def _grpo(
    model: Any, shape: ModelShape, case: str, dtype: str, **settings: Any
) -> list[dict[str, Any]]:
    """k = 2 groups open while two closed groups' parts sit in the update's sum."""
    from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward
    from thundersync.learner.trainer import Learner

    cfg = _cfg("grpo", dtype, 2, 64, **settings)
    learner = Learner(model, cfg)
    eng = learner.open_update()
    g = torch.Generator().manual_seed(0)

    def toks(n: int) -> tuple[int, ...]:
        return tuple(int(x) for x in torch.randint(8, shape.vocab, (n,), generator=g))

    for gi in range(4):
        eng.register_group(GrpoGroupSpec(f"g{gi}", toks(8), 2))
    t = 0.0
    order = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    for gi, i in order:
        t += 1.0
        eng.submit(GrpoReward(f"g{gi}/r{i}", f"g{gi}", i, float(i)), t)
        eng.submit(GrpoContent(f"g{gi}/t{i}", f"g{gi}", i, toks(24), (1,) * 24), t)
        eng.drain()
    eng.close_batch()
    eng.drain()
    peak = eng.pool.peak_held_bytes
    learner.step(eng)
    plan = plan_memory(cfg, shape, _FAR)
    planned = _planned(plan, "accumulators") + _planned(plan, "update sum (")
    rows = [_row(case, "accumulators + update sum (GRPO)", "measured: pool peak", peak, planned)]
    states = learner.optimizer.opt.state.values()  # type: ignore[attr-defined]
    adam = sum(v.numel() * v.element_size() for s in states for v in s.values() if v.dim())
    rows.append(
        _row(case, "AdamW moments", "measured: optimizer state", adam, _planned(plan, "AdamW"))
    )
    master = learner.optimizer.master
    if master[0] is not learner.params[0]:
        mb = sum(p.numel() * p.element_size() for p in master)
        rows.append(_row(case, "master weights", "measured", mb, _planned(plan, "master")))
    scratch = sum(v.numel() * v.element_size() for v in learner.router._scratch.values())
    if scratch:
        rows.append(
            _row(case, "LM head dW scratch", "measured", scratch, _planned(plan, "LM head dW"))
        )
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows.append(_row(case, "weights", "counted: parameters", weights, _planned(plan, "weights")))
    return rows


def _opd(model: Any, shape: ModelShape, case: str, dtype: str) -> list[dict[str, Any]]:
    """Two trajectories close first (the update's sum holds two parts), then one of 128 + 2
    tokens: its K/V store would double to 256 positions and stops at T = 130, the plan's figure."""
    from thundersync.learner.sources import OpdClose, OpdTurn
    from thundersync.learner.trainer import Learner

    tokens = 130
    cfg = _cfg("opd", dtype, 1, tokens)
    learner = Learner(model, cfg)
    eng = learner.open_update()
    g = torch.Generator().manual_seed(1)
    t = 0.0
    for ti, lens in enumerate(((8, 8), (8, 8), (128, 2))):
        tid = f"o{ti}"
        eng.register_trajectory(tid)
        for j, n in enumerate(lens):
            ids = tuple(int(x) for x in torch.randint(8, shape.vocab, (n,), generator=g))
            mask = (0,) + (1,) * (n - 1)
            teacher = tuple(-1.0 for _ in range(n - 1))
            t += 1.0
            eng.submit(OpdTurn(f"{tid}/t{j}", tid, j, ids, mask, teacher), t)
            eng.drain()
        eng.submit(OpdClose(f"{tid}/close", tid, len(lens)), t)
        eng.drain()
    eng.close_batch()
    eng.drain()
    plan = plan_memory(cfg, shape, _FAR)
    planned = (
        _planned(plan, "accumulators")
        + _planned(plan, "update sum (")
        + _planned(plan, "OPD K/V stores")
    )
    return [
        _row(
            case,
            "sums + update sum + K/V store (OPD)",
            "measured: pool peak",
            eng.pool.peak_held_bytes,
            planned,
        )
    ]


def _past_leaves(model: Any, past: int) -> list[Any]:
    """K/V leaves of `past` random tokens (none for 0), made without a graph."""
    from thundersync.learner.boundary import detach_leaves, run_segment

    if not past:
        return []
    ids = torch.randint(8, int(model.config.vocab_size), (past,))
    with torch.no_grad():
        return detach_leaves(run_segment(model, ids, past=[], start=0).kv)


def _saved(model: Any, own: int, past: int) -> int:
    from thundersync.learner.boundary import run_segment
    from thundersync.learner.logprobs import scored_logprobs

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    vocab = int(model.config.vocab_size)
    leaves = _past_leaves(model, past)
    skip = params | {x.untyped_storage().data_ptr() for kv in leaves for x in kv}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        st = x.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return x

    ids = torch.randint(8, vocab, (own,))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = run_segment(model, ids, past=leaves, start=past)
        scored_logprobs(model, out.hidden, ids, torch.ones(own - 1, dtype=torch.bool))
    return sum(seen.values())


def _kept_per_layer(model: Any, own: int, past: int) -> int:
    """Live bytes a forward under per-layer checkpointing leaves for its backward (`LiveBytes`:
    checkpoint regions keep their inputs in closures, which saved-tensor hooks do not see)."""
    from thundersync.learner.boundary import run_segment
    from thundersync.learner.logprobs import scored_logprobs
    from thundersync.plan.live import LiveBytes

    vocab = int(model.config.vocab_size)
    leaves = _past_leaves(model, past)
    ids = torch.randint(8, vocab, (own,))
    with LiveBytes() as meter:
        out = run_segment(model, ids, past=leaves, start=past, checkpoint="layer")
        lp = scored_logprobs(model, out.hidden, ids, torch.ones(own - 1, dtype=torch.bool))
    kept = meter.settled()
    del out, lp
    return kept


def _as_learner(model: Any) -> Any:
    """The model as the learner runs it (`Learner` switches sdpa to the mask-free causal path)."""
    from thundersync.learner.attention import use_causal_kernel

    use_causal_kernel(model)
    return model


def _activations(model: Any, shape: ModelShape, case: str, b: int) -> list[dict[str, Any]]:
    rows = []
    for own, past in ((96, 0), (96, 48), (48, 96)):  # no past; padded query; a mask
        rows.append(
            _row(
                case,
                f"saved activations ({own} tokens on {past} past)",
                "measured: saved tensors",
                _saved(model, own, past),
                act.segment_bytes(shape, b, own, past),
            )
        )
        rows.append(
            _row(
                case,
                f"kept under per-layer checkpointing ({own} tokens on {past} past)",
                "measured: live bytes",
                _kept_per_layer(model, own, past),
                own * act.layer_kept(shape, b),
            )
        )
    return rows


def _small(hidden: int, layers: int, arch: str, dtype: str, case: str) -> list[dict[str, Any]]:
    from thundersync.config import Arch
    from thundersync.hf_models import build_tiny_model, load_model

    torch.manual_seed(0)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    with tempfile.TemporaryDirectory() as tmp:
        d = build_tiny_model(Path(tmp) / "m", seed=0, hidden=hidden, layers=layers, arch=Arch(arch))
        shape = load_shape(Path(d))
        rows = _activations(
            _as_learner(load_model(d, dtype=dt)), shape, case, {"float32": 4, "bfloat16": 2}[dtype]
        )
        rows += _grpo(load_model(d, dtype=dt), shape, case, dtype)
        rows += _opd(load_model(d, dtype=dt), shape, case, dtype)
        from thundersync.config import LearnerConfig

        if "grpo_sum" in LearnerConfig.model_fields:  # float64 G1 / G2 (learner.grpo_sum)
            f64 = f"{case}, grpo_sum float64"
            rows += _grpo(load_model(d, dtype=dt), shape, f64, dtype, grpo_sum="float64")[:1]
    return rows


def _meta(name: str) -> list[dict[str, Any]]:
    """The shape's real HF model on the meta device: parameter bytes counted, none allocated."""
    import json

    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    raw = json.loads((SHAPES_DIR / f"{name}.json").read_text())
    hf = CONFIG_MAPPING[raw["model_type"]](**{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    shape = load_shape(name)
    cfg = _cfg("grpo", "bfloat16", 1, 2048)
    plan = plan_memory(cfg, shape, Machine(1, 10**15, 10**15))
    slot = sum(-(-p.numel() * 2 // 64) * 64 for p in model.state_dict().values())
    case = f"{name} (meta)"
    return [
        _row(case, "weights (bf16)", "counted: meta parameters", 2 * n, _planned(plan, "weights")),
        _row(case, "master (fp32)", "counted", 4 * n, _planned(plan, "master")),
        _row(case, "AdamW moments", "counted", 8 * n, _planned(plan, "AdamW")),
        _row(case, "G1 + G2 (1 open group)", "counted", 8 * n, _planned(plan, "accumulators")),
        _row(
            case,
            "shm slot (64-byte aligned)",
            "counted",
            slot,
            _planned(plan, "/dev/shm publish") // 2,
        ),
    ]


def run_plan_check(*, big: bool = True, mid: bool = True) -> dict[str, Any]:
    torch.set_num_threads(1)
    rows = _small(64, 2, "llama", "float32", "tiny llama fp32")
    rows += _small(64, 2, "qwen3", "bfloat16", "tiny qwen3 bf16")
    if mid:
        rows += _small(512, 6, "llama", "float32", "20M llama fp32")
    if big:
        for name in ("qwen3-8b", "llama-3-8b", "qwen3-32b"):
            rows += _meta(name)
    worst = max(r["rel_err"] for r in rows)
    return {
        "rows": rows,
        "cases": sorted({r["case"] for r in rows}),
        "max_rel_err": worst,
        "measured_rows": sum(r["how"].startswith("measured") for r in rows),
        "counted_rows": sum(r["how"].startswith("counted") for r in rows),
        "goal_met": worst <= 0.10,
    }
