"""The memory plan: hand-computed formulas, the shipped recipes on 80 / 141 GB GPUs, the refusal
naming its knob (in the plan and when a run starts), `tsrl plan --json` and the plan-check bench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from thundersync.config import load_run_config
from thundersync.plan import activations as act
from thundersync.plan.advice import refuse
from thundersync.plan.memory import GB, Machine, plan_memory
from thundersync.plan.shape import load_shape, shape_from_config

TSRL = str(Path(sys.executable).with_name("tsrl"))
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
CPU = Machine(0, None, 10**12)


def _bytes(plan: object, prefix: str) -> int:
    return sum(c.bytes for c in plan.components if c.name.startswith(prefix))  # type: ignore[attr-defined]


def test_tiny_plan_equals_hand_formulas() -> None:
    s = shape_from_config(TINY, "tiny")
    d, v, i, layers = 64, 1000, 192, 2
    q, kv = 64, 32  # 4 x 16, 2 x 16
    layer = d * q + 2 * d * kv + q * d + 3 * d * i + 2 * d
    n = 2 * v * d + layers * layer + d
    assert s.params == n
    cfg = load_run_config(
        data={"learner": {"max_open_groups": 3}, "rollout": {"max_total_tokens": 100}}
    )
    plan = plan_memory(cfg, s, CPU)
    assert _bytes(plan, "weights") == 4 * n
    assert _bytes(plan, "AdamW") == 8 * n
    assert _bytes(plan, "accumulators") == 2 * 3 * 4 * n
    assert _bytes(plan, "update sum") == 2 * 4 * n
    assert _bytes(plan, "LM head dW") == 4 * v * d
    # fp32, no past: norms 2 x (4d + 4d + 4), 4 q-sized + lse, MLP 4 x 4 x I, own K/V 2 x 4 x kv
    own = 2 * (8 * d + 4) + 4 * 4 * q + 4 * 4 + 4 * 4 * i
    fwd = 4 * d + 4 * d + 4 + 4 * d + 2 * 4 * 16 + 28
    assert act.segment_bytes(s, 4, 100, 0) == 100 * (layers * (own + 2 * 4 * kv) + fwd)
    # a longer past: K/V repeated to the 4 query heads over every context token, plus the mask
    # SDPA keeps per layer off CUDA (none on CUDA: flash takes the lower-right causal itself)
    with_past = 40 * (layers * own + fwd) + layers * 2 * 4 * q * 100
    assert act.segment_bytes(s, 4, 40, 60) == with_past + layers * 40 * 100 * 4
    assert act.segment_bytes(s, 4, 40, 60, cuda=True) == with_past
    # a past no longer than the segment: the query padded in front (q, output, lse per padded
    # row), one more q-sized row per own token, K/V not repeated
    padded = 60 * (layers * own + fwd) + layers * (2 * 4 * kv * 100 + 40 * (2 * 4 * q + 16))
    assert act.segment_bytes(s, 4, 60, 40) == padded + layers * 60 * 4 * q
    static = sum(c.bytes for c in plan.components if c.phase == "static" and c.where == "host")
    update = sum(c.bytes for c in plan.components if c.phase == "update" and c.where == "host")
    assert plan.host_bytes == static + update + plan.shm_bytes
    assert plan.per_gpu_bytes == 0 and plan.fits


def test_qwen3_8b_recipe_fits_141_gb_and_80_gb() -> None:
    cfg = load_run_config("grpo-qwen3-8b")
    s = load_shape("qwen3-8b")
    n = s.params
    big = plan_memory(cfg, s, Machine(8, 141 * GB, 2048 * GB))
    gpu = [c for c in big.components if c.where == "gpu"]
    # 4 FSDP2 ranks: replica 2N + fp32 shards 4N/4 + AdamW 8N/4 + rank 0's delta base 2N
    assert sum(c.bytes for c in gpu if c.phase == "static") == 2 * n + n + 2 * n + 2 * n
    # the barrier's reduction holds one fp64 bucket on the GPU, not the whole 8N sum
    reduce = [c for c in gpu if c.phase == "reduce"]
    assert [c.bytes for c in reduce] == [256 * 2**20], reduce
    # FSDP2's start-up fills the shards one tensor at a time (no whole fp32 copy: 3N before)
    startup = [c for c in gpu if c.phase == "startup"]
    assert [c.bytes for c in startup] == [2 * s.largest_param * 4], startup
    assert big.peak_phase("gpu") == "update"
    assert big.fits and refuse(big, cfg) is None
    small = plan_memory(cfg, s, Machine(8, 80 * GB, 2048 * GB))
    assert small.fits, small.per_gpu_bytes / GB
    # the recipe's per-layer checkpointing is what fits 80 GB: whole-segment recompute does not
    seg = load_run_config("grpo-qwen3-8b", {"learner": {"activation_checkpointing": "segment"}})
    why = refuse(plan_memory(seg, s, Machine(8, 80 * GB, 2048 * GB)), seg)
    assert why is not None and "learner.activation_checkpointing=layer" in why, why


def test_refusal_names_the_knob_that_makes_it_fit() -> None:
    s = shape_from_config(TINY, "tiny")
    cfg = load_run_config(data={"rollout": {"max_total_tokens": 2**22}})
    plan = plan_memory(cfg, s, Machine(0, None, 8 * GB))
    why = refuse(plan, cfg)
    assert why is not None and "rollout.max_total_tokens=" in why, why
    many = load_run_config(data={"learner": {"max_open_groups": 1000}})
    shape8b = load_shape("qwen3-8b")
    why = refuse(plan_memory(many, shape8b, Machine(0, None, 4000 * GB)), many)
    assert why is not None and "learner.max_open_groups=" in why, why


def test_a_run_that_cannot_fit_is_refused_before_any_rollout(tmp_path: Path) -> None:
    from thundersync.driver.run import RunDriver
    from thundersync.plan.guard import PlanRefused

    cfg = load_run_config("grpo-toy", {"updates": 1, "rollout.max_total_tokens": 2**34})
    with pytest.raises(PlanRefused, match=r"rollout\.max_total_tokens="):
        RunDriver(cfg, tmp_path / "run").run()
    run = tmp_path / "run"
    assert not (run / "where").exists()  # no learner rank was started
    text = (run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").exists() else ""
    assert text == ""  # no update, no rollout
    assert "memory plan" in (run / "status.json").read_text()


def test_run_start_check_obeys_the_host_memory_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    from thundersync.plan.guard import PlanRefused, check_run_memory

    cfg = load_run_config("grpo-toy")
    plan = check_run_memory(cfg, tiny_model_dir, None)
    assert plan is not None and plan.fits
    monkeypatch.setenv("TSRL_PLAN_HOST_GB", "0.001")
    with pytest.raises(PlanRefused, match="TSRL_MEMORY_CHECK=0"):
        check_run_memory(cfg, tiny_model_dir, None)
    monkeypatch.setenv("TSRL_MEMORY_CHECK", "0")
    check_run_memory(cfg, tiny_model_dir, None)


def _plan_cli(*args: str) -> tuple[int, dict[str, object]]:
    res = subprocess.run(
        [TSRL, "plan", *args, "--json"], capture_output=True, text=True, timeout=120
    )
    return res.returncode, json.loads(res.stdout.strip().splitlines()[-1])


def test_tsrl_plan_json_last_line_for_both_recipes() -> None:
    code, out = _plan_cli(
        "grpo-qwen3-8b", "--gpus", "8", "--gpu-memory", "141", "--host-memory", "2048"
    )
    assert code == 0 and out["fits"] is True
    for key in ("per_gpu_bytes", "host_bytes", "shm_bytes", "components"):
        assert key in out
    code, out = _plan_cli(
        "grpo-qwen3-8b", "--gpus", "8", "--gpu-memory", "80", "--host-memory", "2048"
    )
    assert code == 0 and out["fits"] is True and not out["refusal"]
    for gb in ("80", "141"):
        code, out = _plan_cli(
            "opd-qwen3-32b", "--gpus", "8", "--gpu-memory", gb, "--host-memory", "2048"
        )
        assert code == 1 and out["fits"] is False and "qwen3-32b" in str(out["refusal"])


def test_plan_check_runs_small() -> None:
    from thundersync.plan.check import run_plan_check

    res = run_plan_check(big=True, mid=False)
    assert res["measured_rows"] >= 10 and res["counted_rows"] >= 10
    assert res["max_rel_err"] <= 0.10, [r for r in res["rows"] if r["rel_err"] > 0.10]


def test_8b_grpo_at_32k_tokens_fits_an_h200_with_per_layer_checkpointing() -> None:
    """Long context: one 32k-token segment's activations at 8B are ~265 GB kept whole (segment
    mode recomputes the segment at once) and ~23 GB with one layer recomputed at a time."""
    s = load_shape("qwen3-8b")
    h200 = Machine(8, 141 * GB, 2048 * GB)
    over = {"rollout": {"max_total_tokens": 32768}}
    segment = load_run_config(
        "grpo-qwen3-8b", over | {"learner": {"activation_checkpointing": "segment"}}
    )
    layer = load_run_config(
        "grpo-qwen3-8b", over | {"learner": {"activation_checkpointing": "layer"}}
    )
    assert not plan_memory(segment, s, h200).fits
    why = refuse(plan_memory(segment, s, h200), segment)
    assert why is not None and "learner.activation_checkpointing=layer" in why, why
    plan = plan_memory(layer, s, h200)
    assert plan.fits, plan.per_gpu_bytes / GB
    acts = next(c for c in plan.components if c.name.startswith("activations"))
    assert acts.bytes < 25 * GB


def test_host_placed_optimizer_leaves_the_replica_on_the_gpu() -> None:
    """`learner.optimizer_device: host` (the paper's Adam on the host): per GPU the replica and
    rank 0's delta base; the fp32 shards and AdamW moments count once per rank on the host."""
    s = load_shape("qwen3-8b")
    n, h200 = s.params, Machine(8, 141 * GB, 2048 * GB)
    dev = plan_memory(load_run_config("grpo-qwen3-8b"), s, h200)
    host_cfg = load_run_config("grpo-qwen3-8b", {"learner": {"optimizer_device": "host"}})
    host = plan_memory(host_cfg, s, h200)
    static = [c for c in host.components if c.phase == "static"]
    assert sum(c.bytes for c in static if c.where == "gpu") == 2 * n + 2 * n
    # per rank fp32 shards 4N / 4 and moments 8N / 4 bytes: 12N more on the host for 4 ranks
    moved = sum(c.bytes for c in static if c.where == "host") - sum(
        c.bytes for c in dev.components if c.phase == "static" and c.where == "host"
    )
    assert moved == 4 * n + 8 * n
    assert not [c for c in host.components if c.where == "gpu" and c.phase == "step"]


def test_opd_recipes_fit_h200s_by_the_plan_with_their_placements() -> None:
    """Qwen3-32B OPD fits 141 GB GPUs once the fp32 master / AdamW and the delta's base live on the
    host (the recipe's placements); Qwen3-8B OPD at 131k tokens fits with segmented turns and is
    refused without them, the refusal offering `learner.opd_segment_tokens`."""
    h200 = Machine(8, 141 * GB, 2200 * GB)
    big = load_run_config("opd-qwen3-32b")
    s32 = load_shape("qwen3-32b")
    plan = plan_memory(big, s32, h200)
    assert plan.fits, (plan.per_gpu_bytes / GB, plan.host_bytes / GB)
    on_gpu = load_run_config("opd-qwen3-32b", {"publish": {"delta_base": "device"}})

    def gpu_static(p: object) -> int:
        return sum(c.bytes for c in p.components if c.where == "gpu" and c.phase == "static")  # type: ignore[attr-defined]

    moved = gpu_static(plan_memory(on_gpu, s32, h200)) - gpu_static(plan)
    assert moved == 2 * s32.params  # rank 0's bf16 base: N x 2 B off the GPU
    gpu_opt = load_run_config("opd-qwen3-32b", {"learner": {"optimizer_device": "device"}})
    why = refuse(plan_memory(gpu_opt, s32, h200), gpu_opt)
    assert why is not None and "learner.optimizer_device=host" in why, why
    long = load_run_config("opd-qwen3-8b-131k")
    s8 = load_shape("qwen3-8b")
    assert long.rollout.max_total_tokens == 131072
    assert plan_memory(long, s8, h200).fits
    whole = load_run_config("opd-qwen3-8b-131k", {"learner": {"opd_segment_tokens": None}})
    why = refuse(plan_memory(whole, s8, h200), whole)
    assert why is not None and "learner.opd_segment_tokens=" in why, why
