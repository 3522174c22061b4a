"""The learner as a user drives it: open an update at theta_k, feed sources, step at the barrier.

learner = Learner(model, cfg, publish=engines.publish)
engine = learner.open_update()             # theta_k fixed for every gradient of update k
engine.register_group(...); engine.submit(source, ready_time); engine.drain()   # as they come
engine.close_batch(); engine.drain()
stats = learner.step(engine)               # exactly one optimizer step, then publish + ack
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from thundersync.config import OpdTurnGraphs, RunConfig, Schedule
from thundersync.learner.accumulators import BufferPool, FlatSpec
from thundersync.learner.arch import check_cuttable
from thundersync.learner.attention import use_causal_kernel
from thundersync.learner.barrier import Publisher, StepStats, barrier_step
from thundersync.learner.device import DTYPES, accumulator_device, resolve_device, set_determinism
from thundersync.learner.engine import GradientEngine
from thundersync.learner.lora import apply_lora, merged_state_dict
from thundersync.learner.parallel import (
    FSDP2Optimizer,
    LocalOptimizer,
    ParallelContext,
    StepOptimizer,
)
from thundersync.learner.routing import GradRouter, GradSink


class Learner:
    def __init__(
        self,
        model: nn.Module,
        cfg: RunConfig,
        *,
        publish: Publisher | None = None,
        ctx: ParallelContext | None = None,
    ) -> None:
        check_cuttable(model)  # refuse, by layer type, what the boundary code cannot cut
        self.cfg = cfg
        bucket = int(cfg.learner.reduce_bucket_mb * 2**20)
        self.ctx = replace(ctx or ParallelContext(), bucket_bytes=bucket)
        self.device = resolve_device(cfg.learner.device)
        set_determinism(cfg.learner.deterministic, self.device)
        if cfg.model.lora_rank > 0:
            m = cfg.model
            model = apply_lora(model, m.lora_rank, m.lora_alpha, cfg.seed, m.lora_targets)
        # the model keeps the dtype it was loaded in (bf16 compute: fp32 master weights live in
        # the optimizer); the learner only places it
        self.model = model.to(self.device)
        self.model.eval()  # no dropout: a gradient is a pure function of theta_k and its source
        use_causal_kernel(self.model)  # segments on a past: SDPA without an explicit mask
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.publish = publish
        self.version = 0
        self.last_engine: GradientEngine | None = None  # the engine of the last step (its counters)
        self.accum_device = accumulator_device(cfg.learner.accum_device, self.device)
        # one hook per parameter, for every update: gradients go straight into the sums
        acc_dtype = DTYPES[cfg.learner.accum_dtype]
        flat = FlatSpec(self.params, device=self.accum_device)
        self.router = GradRouter(self.params, GradSink(flat, self.accum_device, acc_dtype))
        self.adders = _adders(cfg.learner.host_threads)  # for the learner's life
        self.optimizer: StepOptimizer
        # the fp32 master / shards and AdamW: on the host or the compute device, as accumulators
        where = accumulator_device(cfg.learner.optimizer_device, self.device)
        if self.ctx.distributed:
            on_host = where.type == "cpu"
            self.optimizer = FSDP2Optimizer(model, self.params, cfg.optim, self.ctx, host=on_host)
        else:
            self.optimizer = LocalOptimizer(self.params, cfg.optim, device=where)

    def open_update(self, schedule: Schedule | None = None) -> GradientEngine:
        lc = self.cfg.learner
        return GradientEngine(
            self.model,
            self.params,
            schedule=schedule or self.cfg.schedule,
            estimator=lc.estimator,
            std_eps=lc.std_eps,
            token_weighting=lc.token_weighting,
            group_reduction=lc.group_reduction,
            grpo_sum=lc.grpo_sum,
            reward_shift=lc.reward_shift,
            max_open_groups=lc.max_open_groups,
            max_held_bytes=lc.max_held_bytes,
            accum_dtype=DTYPES[lc.accum_dtype],
            accum_device=self.accum_device,
            checkpoint=lc.activation_checkpointing,
            keep_turn_graphs=self.keep_turn_graphs,
            logprob_chunk=lc.logprob_chunk,
            pool=BufferPool(self.accum_device, adders=self.adders),
            router=self.router,
            kv_limit=self.cfg.rollout.max_total_tokens,
            opd_segment_tokens=lc.opd_segment_tokens,
        )

    @property
    def keep_turn_graphs(self) -> bool:
        mode = self.cfg.learner.opd_turn_graphs
        if mode is OpdTurnGraphs.AUTO:
            return self.device.type != "cuda"  # GPU memory is the scarce resource there
        return mode is OpdTurnGraphs.KEEP

    def step(self, engine: GradientEngine) -> StepStats:
        stats = barrier_step(
            engine,
            objective=self.cfg.objective,
            optimizer=self.optimizer,
            ctx=self.ctx,
            max_grad_norm=self.cfg.optim.max_grad_norm,
            version=self.version,
            publish=self._publish_stepped if self.publish is not None else None,
            group_reduction=self.cfg.learner.group_reduction,
        )
        self.version = stats.version
        self.last_engine = engine
        return stats

    def _publish_stepped(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        # theta is read here, after the optimizer step: a LoRA merge is a copy, not a view of
        # the stepped parameters (the barrier's own `weights` argument is not used)
        assert self.publish is not None
        return self.publish(version, self.weights())

    def weights(self) -> dict[str, torch.Tensor]:
        """theta as the engines load it: the plain HF state dict (LoRA: merged, base names)."""
        if self.cfg.model.lora_rank > 0:
            return merged_state_dict(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def flat_params(self) -> torch.Tensor:
        """theta as the optimizer steps it (the fp32 master copy for a bf16 model), float64.
        FSDP2: the fp32 shards gathered (a collective: every rank calls it), not the replica."""
        opt = self.optimizer
        if isinstance(opt, FSDP2Optimizer):
            whole = [sp.detach().full_tensor() for sp in opt.sharded]
        else:
            whole = list(opt.master)
        return torch.cat([p.detach().reshape(-1).double().cpu() for p in whole])

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.params[0].dtype

    @property
    def master_dtype(self) -> torch.dtype:
        return self.optimizer.step_dtype

    # ---- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            # copied to the host tensor by tensor: a device clone was a whole replica on the GPU
            "params": {
                n: p.detach().to("cpu", copy=True)
                for n, p in zip(self.names, self.optimizer.master, strict=True)
            },
            "optimizer": self.optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = set(self.names) - set(state["params"])
        if missing:
            raise ValueError(
                f"checkpoint lacks parameters {sorted(missing)[:3]}...: it was written for another "
                "model or LoRA setting; resume with the same model.* config"
            )
        with torch.no_grad():
            for n, p, m in zip(self.names, self.params, self.optimizer.master, strict=True):
                m.copy_(state["params"][n])  # the master copy (theta itself in fp32 / fp64)
                p.copy_(m)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])


def _adders(threads: int) -> ThreadPoolExecutor | None:
    """The host adds' thread pool (`learner.host_threads`), None for one thread; more threads than
    this host's cores are refused (each would only wait for a core)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if threads > (cores or 1):
        raise ValueError(
            f"learner.host_threads={threads} but this learner has {cores} cores: set it to "
            f"{cores} or fewer"
        )
    return ThreadPoolExecutor(threads, "tsrl-add") if threads > 1 else None
