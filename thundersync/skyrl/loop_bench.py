"""`tsrl bench skyrl-loop`: SkyRL's own trainer loop, batch-synchronous vs ThunderSync's streaming
learner, on the same workload (same prompts, same seeds: the same sampled tokens).

Parity: each update's pre-clip gradient of the streaming trainer against SkyRL's sync update, and
the parameter gap after all updates. Speed: paired rounds of both loops, generation threads on
one core and the learner on the other (`CPUExp(pin=True)`); R, L and P are SkyRL's own timers in
the sync loop (`generate`; `fwd_logprobs_values_reward` + `train_critic_and_policy`;
`sync_weights`), the bound (R + L + P) / (max(R, L) + P), the speedup the ratio of median step
times (the first step of a round is warm-up and left out).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.bench.speedup_stats import bound
from thundersync.skyrl.loop import CPUExp, LoopMode, experiment
from thundersync.skyrl.parity import flat64

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PROMPT = [{"role": "user", "content": "Reply with numbers only."}]


@dataclass(frozen=True)
class LoopWorkload:
    """A GRPO run of SkyRL's loop on the tiny model and the digits task (`tsrl-digits`)."""

    prompts: int = 2  # trainer.train_batch_size
    group_size: int = 2  # generator.n_samples_per_prompt
    max_tokens: int = 8
    steps: int = 2
    width: int = 64
    layers: int = 2
    lr: float = 1e-3
    seed: int = 0
    concurrency: int = 8  # requests the engine serves at once (tsrl.rollout.concurrency)
    tool_turns: int = 0  # sandboxed tool calls before the answer: 1 + row % tool_turns
    tool_seconds: float = 0.1
    objective: str = "grpo"  # or "opd": SkyRL's distillation recipe, a second tiny model teaches
    dtype: str = "float32"  # float64: models, engine and accumulators (the exactness check)

    def overrides(self, root: Path) -> list[str]:
        from thundersync.hf_models import build_tiny_model, load_tokenizer

        model, teacher = root / "model", root / "teacher"
        if not model.exists():
            build_tiny_model(model, seed=self.seed, hidden=self.width, layers=self.layers)
            tok = load_tokenizer(model)
            tok.chat_template = CHAT_TEMPLATE  # SkyRL's generator renders chats with it
            tok.save_pretrained(model)
            if self.objective == "opd":
                build_tiny_model(teacher, seed=self.seed + 1, hidden=self.width, tokenizer=tok)
        data = root / "train.jsonl"
        rows = [
            {"prompt": PROMPT, "env_class": "tsrl-digits", "seed": i}
            | ({"tool_turns": 1 + i % self.tool_turns} if self.tool_turns else {})
            | {"tool_seconds": self.tool_seconds}
            for i in range(self.prompts * self.steps)
        ]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        args = {
            "trainer.policy.model.path": model,
            "data.train_data": f"['{data}']",
            "trainer.train_batch_size": self.prompts,
            "trainer.policy_mini_batch_size": self.prompts,
            "generator.n_samples_per_prompt": self.group_size,
            "generator.sampling_params.max_generate_length": self.max_tokens,
            "generator.max_turns": self.tool_turns + 1,
            "trainer.policy.optimizer_config.lr": self.lr,
            "trainer.algorithm.use_kl_loss": "false",
            "trainer.algorithm.loss_reduction": "sequence_mean",
            "trainer.epochs": 1,
            "data.dataloader.num_workers": 0,
            "trainer.seed": self.seed,
            "trainer.logger": "console",
            "trainer.ckpt_interval": 0,
            "trainer.hf_save_interval": 0,
            "trainer.eval_interval": -1,
            "trainer.placement.colocate_all": "false",
            "generator.inference_engine.enable_ray_prometheus_stats": "false",
            "trainer.export_path": root / "export",
            "trainer.ckpt_path": root / "ckpt",
        }
        if self.objective == "opd":  # SkyRL's on-policy distillation recipe
            args |= {
                "trainer.algorithm.advantage_estimator": "thundersync_opd",
                "trainer.algorithm.policy_loss_type": "importance_sampling",
                "trainer.algorithm.loss_reduction": "token_mean",
                "trainer.algorithm.use_kl_in_reward": "true",
                "trainer.ref.model.path": teacher,
            }
        ours = [f"tsrl.rollout.concurrency={self.concurrency}"]
        if self.dtype != "float32":
            ours += [f"tsrl.model.dtype={self.dtype}", f"tsrl.learner.accum_dtype={self.dtype}"]
        return [f"{k}={v}" for k, v in args.items()] + ours


def run_loop(
    args: list[str], mode: LoopMode, *, pin: bool = False, record: bool = True
) -> dict[str, Any]:
    """One run of SkyRL's loop: per-step timers, per-update gradients, final parameters."""
    exp: CPUExp = experiment([*args, f"tsrl.loop={mode.value}"], pin=pin, record=record)
    exp.run()
    worker = exp.trainer.dispatch.worker
    steps = [
        {k[len("timing/") :]: float(v) for k, v in d.items() if k.startswith("timing/")}
        for d in exp.logged
        if any(k.startswith("timing/") for k in d)
    ]
    flat = flat64(worker.weights().values())
    probe = getattr(exp.trainer, "probe", None)
    return {
        "logged": exp.logged,
        "steps": steps,
        "grads": worker.grads or [],
        "probe_grads": probe.grads if probe is not None else [],
        "params": flat,
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def parity(w: LoopWorkload) -> dict[str, Any]:
    """The streaming loop's update against SkyRL's sync loop's, update by update."""
    from thundersync.hf_models import load_model

    with tempfile.TemporaryDirectory() as tmp:
        args = w.overrides(Path(tmp))
        theta0 = flat64(load_model(Path(tmp) / "model").parameters())
        sync = run_loop(args, LoopMode.SYNC)
        stream = run_loop(args, LoopMode.STREAM)
    # per update at the same weights and batch: SkyRL's update path run on the streaming
    # trainer's batch before its step
    errs = [_rel(a, b) for a, b in zip(stream["grads"], stream["probe_grads"], strict=True)]
    if len(errs) != len(sync["grads"]):
        raise RuntimeError(f"{len(errs)} streamed updates against {len(sync['grads'])} sync ones")
    moved = (sync["params"] - theta0).norm().clamp_min(1e-30)
    turns = sum(float(d.get("policy/streamed_turns", 0)) for d in stream["logged"])
    trajectories = sum(float(d.get("policy/streamed_trajectories", 0)) for d in stream["logged"])
    return {
        "objective": w.objective,
        "streamed_trajectories": trajectories,
        "streamed_turns": turns,  # OPD: sources handed over before their trajectory ended
        "updates": len(errs),
        "grad_rel_err": errs,
        "parity_grad_rel_err": max(errs),
        "parity_param_gap": float((stream["params"] - sync["params"]).norm() / moved),
    }


def _phase(steps: list[dict[str, float]], *keys: str) -> float:
    return statistics.median(sum(s.get(k, 0.0) for k in keys) for s in steps[1:])


ASYNC_STALENESS = 1


def async_overrides(w: LoopWorkload) -> list[str]:
    """SkyRL's fully-async trainer at staleness 1 on the same workload: its required settings
    (a rollout-log-prob loss, generation workers between one and two mini-batches of groups)."""
    return [
        "trainer.fully_async.enabled=true",
        f"trainer.fully_async.max_staleness_steps={ASYNC_STALENESS}",
        f"trainer.fully_async.num_parallel_generation_workers={w.prompts * (ASYNC_STALENESS + 1)}",
        "trainer.algorithm.policy_loss_type=rollout_is",
    ]


def _staleness(logged: list[dict[str, Any]]) -> float:
    values = [float(d["async/staleness_mean"]) for d in logged if "async/staleness_mean" in d]
    return statistics.mean(values) if values else 0.0


def speed(w: LoopWorkload, rounds: int = 3) -> dict[str, Any]:
    """Paired rounds of the loops on pinned cores (sync, stream, SkyRL's fully-async at
    staleness 1); medians over rounds of per-round medians."""
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = w.overrides(Path(tmp))
        for _ in range(rounds):
            sync = run_loop(args, LoopMode.SYNC, pin=True, record=False)["steps"]
            stream = run_loop(args, LoopMode.STREAM, pin=True, record=False)["steps"]
            fa = run_loop([*args, *async_overrides(w)], LoopMode.ASYNC, pin=True, record=False)
            r = _phase(sync, "generate")
            lrn = _phase(sync, "fwd_logprobs_values_reward", "train_critic_and_policy")
            p = _phase(sync, "sync_weights")
            t_sync, t_stream = _phase(sync, "step"), _phase(stream, "step")
            rows.append(
                {
                    "R": r,
                    "L": lrn,
                    "P": p,
                    "bound": bound(r, lrn, p),
                    "sync_step_s": t_sync,
                    "stream_step_s": t_stream,
                    "speedup": t_sync / t_stream,
                    "async_step_s": _phase(fa["steps"], "step"),
                    "async_staleness_mean": _staleness(fa["logged"]),
                }
            )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {
        "rounds": rows,
        "speedup_vs_skyrl_sync": med["speedup"],
        "bound": med["bound"],
        "efficiency": med["speedup"] / med["bound"],
        "skyrl_sync": {k: med[k] for k in ("R", "L", "P", "sync_step_s")},
        "stream_step_s": med["stream_step_s"],
        "skyrl_fully_async": {
            "max_staleness_steps": ASYNC_STALENESS,
            "step_s": med["async_step_s"],
            "speedup_vs_skyrl_sync": med["sync_step_s"] / med["async_step_s"],
            "staleness_mean": med["async_staleness_mean"],
        },
        "stream_staleness": 0,
    }
