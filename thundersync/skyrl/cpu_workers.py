"""Policy workers behind SkyRL's worker calls (`forward`, `forward_backward`, `optim_step`) on CPU.

SkyRL's FSDP policy worker moves every micro-batch to `torch.cuda.current_device()` and its model
wrapper imports flash-attn, so neither runs here. Two in-process workers stand in for it:

- `SkyRLBatchWorker` is SkyRL's synchronous update as its worker computes it: the log-probs of the
  padded batch as its HF wrapper takes them (left-padded block, position ids from the attention
  mask, logits / temperature, the last `num_actions` positions), SkyRL's registered policy loss on
  the advantages its trainer pre-scaled for the loss reduction, one backward, torch's global-norm
  clip and AdamW.
- `StreamingWorker` is ThunderSync's learner: each finished trajectory is a GRPO source applied the
  moment its reward is fixed (on a learner thread, while generation goes on); `optim_step` closes
  the update at the barrier. It never sees SkyRL's batch: the update is equal to the batch one.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from skyrl.backends.skyrl_train.distributed.dispatch import WorkerOutput
from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry
from torch import nn

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.config import RunConfig, Schedule
from thundersync.learner.engine import GradientEngine
from thundersync.learner.parallel import adamw
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward
from thundersync.learner.trainer import Learner
from thundersync.skyrl.opd_stream import OpdTurns


def padded_action_logprobs(model: nn.Module, data: Any, temperature: float) -> torch.Tensor:
    """The action log-probs [B, A] of a SkyRL training batch, A its `response_length`."""
    seq, attn = data["sequences"], data["attention_mask"]
    pos = attn.long().cumsum(-1) - 1
    pos.masked_fill_(attn == 0, 1)
    logits = model(input_ids=seq, attention_mask=attn, position_ids=pos).logits / temperature
    lp = torch.log_softmax(logits.float() if logits.dtype == torch.bfloat16 else logits, -1)
    lp = lp.gather(-1, torch.roll(seq, -1, dims=1).unsqueeze(-1)).squeeze(-1)
    a = int(data.metadata["response_length"])
    return lp[:, -a - 1 : -1]


class SkyRLBatchWorker:
    """SkyRL's synchronous policy update on one CPU rank (see the module doc)."""

    def __init__(self, model: nn.Module, cfg: RunConfig, algo: Any, record: bool = False) -> None:
        self.model, self.algo, self.max_norm = model, algo, cfg.optim.max_grad_norm
        self.grads: list[torch.Tensor] | None = [] if record else None  # per step, pre-clip
        self.model.eval()  # no dropout: both trainers compare the same function
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = adamw(self.params, cfg.optim)
        self.loss_fn = PolicyLossRegistry.get(algo.policy_loss_type)

    def forward(self, data: Any) -> WorkerOutput:
        with torch.no_grad():
            lp = padded_action_logprobs(self.model, data, self.algo.temperature)
        return WorkerOutput(loss_fn_outputs=[{"logprobs": row.tolist()} for row in lp])

    def forward_backward(self, data: Any) -> WorkerOutput:
        lp = padded_action_logprobs(self.model, data, self.algo.temperature)
        old = data["action_log_probs"]
        loss, metrics = self.loss_fn(
            lp,
            old if old is not None else lp.detach(),
            data["advantages"],
            config=self.algo,
            loss_mask=data["loss_mask"],
            rollout_logprobs=data.get("rollout_logprobs"),
        )
        loss.backward()
        return WorkerOutput(
            metrics={"policy_loss": float(loss.detach()), **_scalars(metrics)},
        )

    def optim_step(self) -> float:
        if self.grads is not None:
            self.grads.append(_flat_grad(self.params))
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(norm)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}


def _flat_grad(params: list[nn.Parameter]) -> torch.Tensor:
    return (
        torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        .detach()
        .double()
    )


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


class StreamingWorker:
    """ThunderSync's streaming learner fed one finished trajectory at a time (GRPO), or one
    teacher-scored turn at a time and the trajectory's end (OPD, with `opd`) (module doc)."""

    def __init__(
        self,
        learner: Learner,
        group_size: int,
        core: int | None = None,
        record: bool = False,
        opd: OpdTurns | None = None,
    ) -> None:
        self.learner, self.group_size, self.core, self.opd = learner, group_size, core, opd
        self.grads: list[torch.Tensor] | None = [] if record else None  # per step, pre-clip
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._engine: GradientEngine | None = None
        self._error: BaseException | None = None
        self.applied = 0  # trajectories ended
        self.turns = 0  # OPD turns applied
        self.busy_s = 0.0

    def open(self) -> None:
        """A fresh update: its engine and the learner thread that applies sources as they come."""
        if self._thread is not None:
            raise RuntimeError("an update is already open on this worker")
        self._engine = self.learner.open_update(Schedule.STREAM)
        self._error, self.applied, self.turns, self.busy_s = None, 0, 0, 0.0
        if self.opd is not None:
            self.opd.open.clear()
        self._thread = threading.Thread(target=self._apply_all, name="tsrl-learner", daemon=True)
        self._thread.start()

    def submit(self, uid: str, index: int, trajectory: Any) -> None:
        """A finished trajectory of prompt `uid` (SkyRL's TrajectoryOutput); returns at once."""
        if self._thread is None:
            raise RuntimeError("submit before open: no update is open on this worker")
        self._queue.put(("end", uid, index, trajectory))

    def submit_turn(self, session: Any, context: list[int], output: list[int]) -> None:
        """OPD: a call the engine served for trajectory `session` (SkyRL's session id)."""
        if self._thread is not None and self.opd is not None:
            self._queue.put(("turn", str(session), context, output))

    def _sources(self, engine: GradientEngine, item: tuple[Any, ...], seen: set[str]) -> list[Any]:
        if self.opd is None:  # GRPO: the trajectory's content and reward, its group first
            _, uid, index, traj = item
            if uid not in seen:
                seen.add(uid)
                engine.register_group(GrpoGroupSpec(uid, tuple(traj.prompt_ids), self.group_size))
            return list(grpo_sources(uid, index, traj))
        if item[0] == "turn":  # OPD: scored now, while the environment runs the tool call
            _, traj_id, context, output = item
            if traj_id not in seen:
                seen.add(traj_id)
                engine.register_trajectory(traj_id)
            return list(self.opd.turn(traj_id, context, output))
        _, uid, index, traj = item
        return [self.opd.close(f"{uid}_{index}", traj)]  # SkyRL's session id

    def _apply_all(self) -> None:
        engine = self._engine
        assert engine is not None
        if self.core is not None:
            os.sched_setaffinity(0, {self.core})  # this thread only: the learner's core
        seen: set[str] = set()  # groups (GRPO) / trajectories (OPD) registered
        try:
            for item in iter(self._queue.get, None):
                t0 = time.perf_counter()
                for source in self._sources(engine, item, seen):
                    engine.submit(source, time.monotonic())
                engine.drain()
                self.applied += item[0] == "end"
                self.turns += item[0] == "turn"
                self.busy_s += time.perf_counter() - t0
        except BaseException as e:  # surfaced by optim_step: no partial update is stepped
            self._error = e
            for _ in iter(self._queue.get, None):
                pass

    def optim_step(self) -> float:
        """Every submitted trajectory applied, the barrier and the step; the grad norm."""
        if self._thread is None or self._engine is None:
            raise RuntimeError("optim_step before open: no update is open on this worker")
        self._queue.put(None)
        self._thread.join()
        engine, self._thread, self._engine = self._engine, None, None
        if self._error is not None:
            raise RuntimeError("a trajectory could not be applied; no step taken") from self._error
        engine.close_batch()
        engine.drain()
        stats = self.learner.step(engine)
        if self.grads is not None:
            self.grads.append(stats.grad.detach().double().cpu())
        return float(stats.grad_norm)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.learner.weights()


def grpo_sources(uid: str, index: int, traj: Any) -> Sequence[GrpoContent | GrpoReward]:
    """A SkyRL trajectory as the GRPO sources of ThunderSync's learner: its content (the response
    with SkyRL's loss mask: observation tokens are not scored) and its reward (a per-token reward
    list sums to the score SkyRL's estimators read)."""
    mask = tuple(int(m) for m in traj.loss_mask)
    lps = traj.rollout_logprobs
    scored = None if lps is None else tuple(x for x, m in zip(lps, mask, strict=True) if m)
    reward = traj.reward
    score = float(sum(reward)) if isinstance(reward, list | tuple) else float(reward)
    sid = f"{uid}/{index}"
    return (
        GrpoContent(f"{sid}/content", uid, index, tuple(traj.response_ids), mask, scored),
        GrpoReward(f"{sid}/reward", uid, index, score),
    )
