"""The `logging` section: where the run's metric stream goes besides DIR/metrics.jsonl.

Both exports write under the run directory (thundersync/rundir.py) and are off by default; their
packages are imported only when switched on. A W&B API key is never a config field: W&B reads it
from WANDB_API_KEY itself (online mode only), so it reaches neither the run config nor the logs.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from thundersync.config_base import _Section


class WandbMode(StrEnum):
    OFFLINE = "offline"  # files under DIR/wandb only; `wandb sync` uploads them later
    ONLINE = "online"  # needs WANDB_API_KEY in the environment and network access


class LoggingConfig(_Section):
    tensorboard: bool = Field(
        False, description="TensorBoard event files of every update's metrics (DIR/tensorboard)"
    )
    wandb: bool = Field(
        False, description="a Weights & Biases run of every update's metrics (DIR/wandb)"
    )
    wandb_project: str = Field(
        "thundersync",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="the W&B project (letters, digits, '_', '.', '-')",
    )
    wandb_mode: WandbMode = Field(
        WandbMode.OFFLINE, description="offline: no network; online: WANDB_API_KEY from the env"
    )
