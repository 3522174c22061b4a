"""`tsrl bench gpu`: the learner's CUDA path for real, in one process, JSON out.

- equivalence on the device in fp32 and bf16 (bf16 compute, fp32 master weights): sync / group /
  stream parameter gap, and the bf16 run's gap to an fp32 sync run beside it;
- determinism: the same update twice with `learner.deterministic` on (must be bitwise equal) and
  off (the gap is reported: atomics in CUDA kernels may reorder sums);
- memory: one GRPO update of a ~0.5B-parameter Llama config (bf16) under sync and stream, peak
  device memory of each (`torch.cuda.max_memory_allocated`; RSS on CPU).
Device-generic: `--device cpu --small` runs the same code on a CPU (the test suite does), so a GPU
session spends its minutes on numbers, not on import errors.
"""

from __future__ import annotations

import random
import resource
import time
from typing import Any

import torch

from thundersync.config import Objective, RunConfig, Schedule, load_run_config
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward

HALF_B = {"hidden": 1024, "layers": 28, "intermediate": 4096, "heads": 16, "kv_heads": 4}
SMALL = {"hidden": 64, "layers": 2, "intermediate": 192, "heads": 4, "kv_heads": 2}


def _cfg(device: str, *, dtype: str = "float32", deterministic: bool = False) -> RunConfig:
    return load_run_config(
        data={
            "model": {"dtype": dtype},
            "optim": {"lr": 1e-4, "max_grad_norm": 1.0},
            "learner": {"device": device, "deterministic": deterministic, "max_open_groups": 2},
        }
    )


def _long_batch(rng: random.Random, vocab: int, prompt: int, response: int) -> LoggedBatch:
    b = LoggedBatch(Objective.GRPO)
    for gi in range(2):
        gid = f"g{gi}"
        b.groups.append(
            GrpoGroupSpec(gid, tuple(rng.randrange(8, vocab) for _ in range(prompt)), 4)
        )
        for i in range(4):
            resp = tuple(rng.randrange(8, vocab) for _ in range(response))
            t = rng.uniform(0, 10)
            b.events.append((t, GrpoContent(f"{gid}/t{i}", gid, i, resp, (1,) * response)))
            b.events.append((t + 0.1, GrpoReward(f"{gid}/r{i}", gid, i, rng.random())))
    b.events.sort(key=lambda e: e[0])
    return b


def _model(shape: dict[str, int], vocab: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg: Any = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=vocab,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process-wide on CPU


def memory_check(device: str, small: bool = False) -> dict[str, Any]:
    from thundersync.learner.trainer import Learner

    shape, vocab = (SMALL, 512) if small else (HALF_B, 32000)
    batch = _long_batch(random.Random(0), vocab, *((16, 32) if small else (256, 512)))
    out: dict[str, Any] = {}
    for sched in (Schedule.SYNC, Schedule.STREAM):
        learner = Learner(_model(shape, vocab, torch.bfloat16), _cfg(device, dtype="bfloat16"))
        _peak_reset(learner.device)
        t0 = time.perf_counter()
        replay_update(learner, batch, sched)
        out[f"peak_gb_{sched.value}"] = _peak_gb(learner.device)
        out[f"seconds_{sched.value}"] = time.perf_counter() - t0
        out["params_b"] = sum(p.numel() for p in learner.params) / 1e9
        out["master_dtype"] = str(learner.master_dtype).removeprefix("torch.")
        del learner
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out["peak_ratio_stream_vs_sync"] = out["peak_gb_stream"] / max(out["peak_gb_sync"], 1e-9)
    return out


def determinism_check(device: str, deterministic: bool) -> dict[str, Any]:
    from thundersync.learner.trainer import Learner

    batch = _long_batch(random.Random(1), 512, 16, 32)
    grads = []
    for _ in range(2):
        learner = Learner(
            _model(SMALL, 512, torch.float32), _cfg(device, deterministic=deterministic)
        )
        grads.append(replay_update(learner, batch, Schedule.STREAM).grad.double().cpu())
    if deterministic:
        torch.use_deterministic_algorithms(False)
    return {
        "deterministic": deterministic,
        "bitwise_equal": bool(torch.equal(grads[0], grads[1])),
        "max_abs_diff": float((grads[0] - grads[1]).abs().max()),
    }


def run_gpu_checks(
    device: str = "cuda", *, updates: int = 4, small: bool = False
) -> dict[str, Any]:
    from thundersync.bench.equivalence import run_equivalence

    res: dict[str, Any] = {"device": device}
    for obj in (Objective.GRPO, Objective.OPD):
        for dtype in ("float32", "bfloat16"):
            eq = run_equivalence(obj, updates=updates, dtype=dtype, device=device)
            keep = ("max_param_gap", "max_gap_vs_fp32_sync", "master_dtype", "compute_dtype")
            res[f"equivalence_{obj.value}_{dtype}"] = {k: eq[k] for k in keep if k in eq}
    res["determinism_on"] = determinism_check(device, True)
    res["determinism_off"] = determinism_check(device, False)
    res["memory"] = memory_check(device, small=small)
    fp32_ok = all(res[f"equivalence_{o}_float32"]["max_param_gap"] <= 1e-6 for o in ("grpo", "opd"))
    bf16_ok = all(
        r["max_param_gap"] <= 6e-5 and r["max_gap_vs_fp32_sync"] >= 100 * r["max_param_gap"]
        for r in (res[f"equivalence_{o}_bfloat16"] for o in ("grpo", "opd"))
    )
    res["goals"] = {
        "equivalence_fp32": fp32_ok,
        "equivalence_bf16": bf16_ok,
        "determinism": res["determinism_on"]["bitwise_equal"],
    }
    res["ok"] = all(res["goals"].values())
    return res
