"""Replay a run's logged batches through the `sync` schedule and compare parameters.

A streamed run (log_batches=True) writes every applied source of update k to
`batches/uKKKKK.jsonl` and theta_{k+1} to `weights/`. Replaying those sources from theta_0 with
release at batch close must reproduce every published theta: that is `max_param_gap` of
`tsrl bench speedup`, measured on the real run rather than on synthetic batches.
With LoRA the run publishes merged weights only (no adapters), so the gap is taken on the merged
weights of the adapted layers, computed the same way on both sides (the frozen rest cannot differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from thundersync.bus.events import SourceKind, SourceReady
from thundersync.config import Objective, RunConfig, Schedule
from thundersync.driver.work_items import to_work_items
from thundersync.learner.replay import LoggedBatch
from thundersync.learner.sources import GrpoGroupSpec, OpdClose
from thundersync.rundir import RunFiles

if TYPE_CHECKING:
    from thundersync.learner.trainer import Learner


def load_logged_batch(paths: list[Path], cfg: RunConfig) -> LoggedBatch:
    """One update's sources, from every learner rank's log (`uKKKKK-rR.jsonl`)."""
    lines = [x for p in paths for x in p.read_text().splitlines() if x.strip()]
    events = sorted((SourceReady.model_validate_json(x) for x in lines), key=lambda e: e.ready_at)
    b = LoggedBatch(cfg.objective)
    turns: dict[str, int] = {}
    for ev in events:
        if ev.kind is SourceKind.OPD_TURN:
            if ev.traj_id not in turns:
                b.trajectories.append(ev.traj_id)
            turns[ev.traj_id] = turns.get(ev.traj_id, 0) + 1
        elif ev.group_id not in {g.group_id for g in b.groups}:
            prompt = tuple(ev.token_ids[: ev.prompt_len])
            b.groups.append(GrpoGroupSpec(ev.group_id, prompt, cfg.rollout.group_size))
        b.events += [(ev.ready_at, item) for item in to_work_items(ev)]
    last = max((t for t, _ in b.events), default=0.0)
    b.events += [(last + 1, OpdClose(f"{t}/close", t, n)) for t, n in turns.items()]
    if cfg.objective is Objective.GRPO:
        b.groups.sort(key=lambda g: g.group_id)
    return b


def _flat(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].reshape(-1).double() for n in names])


def _theta(learner: Learner, names: list[str]) -> torch.Tensor:
    """The replayed theta as the run published it: LoRA merged, else the stepped parameters."""
    if learner.cfg.model.lora_rank > 0:
        return _flat(learner.weights(), names)
    return learner.flat_params()


def replay_gap(run_dir: str | Path, cfg: RunConfig, model_dir: str | Path) -> list[float]:
    """Delta_k = ||theta_k^run - theta_k^sync|| / ||theta_k^sync - theta_0|| for every update."""

    from thundersync.driver.learner_proc import LEARNER_THREADS

    before = torch.get_num_threads()
    torch.set_num_threads(LEARNER_THREADS)  # the run's learner's: fp32 matmuls depend on it
    try:
        return _replay_gap(run_dir, cfg, model_dir)
    finally:
        torch.set_num_threads(before)


def _replay_gap(run_dir: str | Path, cfg: RunConfig, model_dir: str | Path) -> list[float]:
    from thundersync.learner.lora import adapted_names
    from thundersync.learner.replay import replay_update
    from thundersync.learner.trainer import Learner
    from thundersync.models import load_model
    from thundersync.rollout.checkpoint import load_state_dict

    files = RunFiles(run_dir)
    learner = Learner(load_model(model_dir), cfg)
    names = adapted_names(learner.model) if cfg.model.lora_rank > 0 else learner.names
    theta0 = _theta(learner, names)
    gaps = []
    for paths in files.batch_logs().values():
        replay_update(learner, load_logged_batch(paths, cfg), Schedule.SYNC)
        ran = _flat(load_state_dict(files.weights(learner.version)), names)
        mine = _theta(learner, names)
        drift = float((mine - theta0).norm())
        gaps.append(float((ran - mine).norm()) / drift if drift else float((ran - mine).norm()))
    return gaps
