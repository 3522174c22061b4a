"""Learner checkpoints: parameters, optimizer state, policy version, RNG; one file per rank.

Written atomically (temp file + rename) so a learner killed mid-save leaves the previous
checkpoint intact; resuming continues bit-identically (same parameters, same AdamW moments).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from thundersync.learner.trainer import Learner


def checkpoint_path(root: str | Path, rank: int = 0) -> Path:
    return Path(root) / f"learner-rank{rank}.pt"


def save_checkpoint(learner: Learner, root: str | Path) -> Path:
    path = checkpoint_path(root, learner.ctx.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(learner.state_dict(), tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(learner: Learner, root: str | Path) -> int:
    path = checkpoint_path(root, learner.ctx.rank)
    if not path.exists():
        raise FileNotFoundError(
            f"no learner checkpoint at {path}: check run_dir / checkpoint_every"
        )
    # tensors land on the host first; the learner copies them onto its device
    learner.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"))
    return learner.version
