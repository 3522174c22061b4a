"""Replay a run's logged batches through the `sync` schedule and compare parameters.

A streamed run (log_batches=True) writes every applied source of update k to
`batches/uKKKKK.jsonl` and theta_{k+1} to `weights/`. Replaying those sources from theta_0 with
release at batch close must reproduce every published theta: that is `max_param_gap` of
`tsrl bench speedup`, measured on the real run rather than on synthetic batches.
With LoRA the run publishes merged weights only (no adapters), so the gap is taken on the merged
weights of the adapted layers, computed the same way on both sides (the frozen rest cannot differ).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from thundersync.bus.events import (
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    OpdTurnReady,
    SourceReady,
    decode_event,
)
from thundersync.config import Objective, RunConfig, Schedule
from thundersync.learner.batch_replay import LoggedBatch
from thundersync.learner.sources import GrpoGroupSpec, OpdClose
from thundersync.rundir import RunFiles
from thundersync.worker.work_items import to_work_item

if TYPE_CHECKING:
    from thundersync.learner.trainer import Learner

Logged = GroupRegistered | SourceReady


def load_logged_batch(paths: list[Path], cfg: RunConfig) -> LoggedBatch:
    """One update's sources, from every learner rank's log (`uKKKKK-rR.jsonl`)."""
    lines = [x for p in paths for x in p.read_text().splitlines() if x.strip()]
    logged = [e for x in lines for e in _decode(x, cfg.rollout.group_size)]
    b = LoggedBatch(cfg.objective)
    sources: list[SourceReady] = []
    for e in logged:
        match e:
            case GroupRegistered() if e.group_id not in {g.group_id for g in b.groups}:
                b.groups.append(GrpoGroupSpec(e.group_id, tuple(e.prompt_ids), e.size))
            case GrpoRewardReady() | GrpoTrajectoryReady() | OpdTurnReady():
                sources.append(e)
    turns: dict[str, int] = {}
    for ev in sorted(sources, key=lambda e: e.ready_at):  # stable: a reward before its content
        if isinstance(ev, OpdTurnReady):
            if ev.traj_id not in turns:
                b.trajectories.append(ev.traj_id)
            turns[ev.traj_id] = turns.get(ev.traj_id, 0) + 1
        b.events.append((ev.ready_at, to_work_item(ev)))
    last = max((t for t, _ in b.events), default=0.0)
    b.events += [(last + 1, OpdClose(f"{t}/close", t, n)) for t, n in turns.items()]
    if cfg.objective is Objective.GRPO:
        b.groups.sort(key=lambda g: g.group_id)
    return b


def _decode(line: str, group_size: int) -> list[Logged]:
    """A batch-log line; a line recorded before the typed sources (one untagged `source_ready`
    per GRPO trajectory or OPD turn) becomes the events it stands for."""
    d = json.loads(line)
    if d.get("type") != "source_ready":
        ev = decode_event(line)
        assert isinstance(ev, Logged), f"not a batch-log event: {type(ev).__name__}"
        return [ev]
    keys = ("run_id", "update", "policy_version", "group_id", "traj_id", "ready_at")
    common: dict[str, Any] = {k: d[k] for k in keys}
    toks, mask, lps = d["token_ids"], d["action_mask"], d.get("rollout_logprobs")
    if d["kind"] == "opd_turn":
        return [
            OpdTurnReady(
                **common,
                source_id=d["source_id"],
                turn=d.get("turn", 0),
                offset=d.get("offset", 0),
                token_ids=toks,
                action_mask=mask,
                teacher_logprobs=d["teacher_logprobs"],
                rollout_logprobs=lps,
            )
        ]
    p, sid, index = d.get("prompt_len", 0), d["source_id"], d["index"]
    reg = {k: d[k] for k in ("run_id", "update", "group_id")}
    return [
        GroupRegistered(**reg, size=group_size, prompt_ids=toks[:p]),
        GrpoRewardReady(**common, source_id=f"{sid}/reward", index=index, reward=d["reward"]),
        GrpoTrajectoryReady(
            **common,
            source_id=sid,
            index=index,
            token_ids=toks[p:],
            action_mask=mask[p:],
            rollout_logprobs=lps,
        ),
    ]


def _flat(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].reshape(-1).double() for n in names])


def _theta(learner: Learner, names: list[str]) -> torch.Tensor:
    """The replayed theta as the run published it: LoRA merged, else the stepped parameters."""
    if learner.cfg.model.lora_rank > 0:
        return _flat(learner.weights(), names)
    return learner.flat_params()


def replay_gap(run_dir: str | Path, cfg: RunConfig, model_dir: str | Path) -> list[float]:
    """Delta_k = ||theta_k^run - theta_k^sync|| / ||theta_k^sync - theta_0|| for every update."""

    from thundersync.worker.learner_proc import LEARNER_THREADS

    before = torch.get_num_threads()
    torch.set_num_threads(LEARNER_THREADS)  # the run's learner's: fp32 matmuls depend on it
    try:
        return _replay_gap(run_dir, cfg, model_dir)
    finally:
        torch.set_num_threads(before)


def _replay_gap(run_dir: str | Path, cfg: RunConfig, model_dir: str | Path) -> list[float]:
    from thundersync.hf_models import load_model
    from thundersync.learner.batch_replay import replay_update
    from thundersync.learner.lora import adapted_names
    from thundersync.learner.trainer import Learner
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
