"""metrics.jsonl's lines, exported where researchers already look: TensorBoard and W&B.

Each sink gets the very dict the metrics line was written from (`RunDirWriter.sinks`), and logs
its numeric fields as scalars at step = `update`; `time` is the event's wall time, not a scalar.
Both write under the run directory (RunFiles.tensorboard, RunFiles.wandb) and are imported only
when `logging.tensorboard` / `logging.wandb` is on. An export that fails mid-run is logged and
switched off: it never fails the training run. A resumed run writes a new W&B run and appends to
the same TensorBoard folder (TensorBoard shows the redone updates' newest points).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from thundersync.config import RunConfig
from thundersync.rundir import RunDirWriter, UpdateSink

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter
    from wandb.sdk.wandb_run import Run as WandbRun

# not scalars: the step itself, the line's kind and its wall time
NOT_SCALARS = frozenset({"type", "update", "time"})


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (bools and non-numbers left out), by key."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class TensorBoardSink:
    def __init__(self, files: RunDirWriter) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise RuntimeError(
                f"logging.tensorboard=true needs the tensorboard package ({e}): "
                "pip install tensorboard (or run `make setup`), or set logging.tensorboard=false"
            ) from None
        files.tensorboard.mkdir(parents=True, exist_ok=True)
        self.writer: SummaryWriter = SummaryWriter(log_dir=str(files.tensorboard))

    def write(self, record: dict[str, Any]) -> None:
        step, wall = int(record["update"]), record.get("time")
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, global_step=step, walltime=wall)
        self.writer.flush()  # a live TensorBoard sees each update as it lands

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: RunConfig, files: RunDirWriter) -> None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError(
                f"logging.wandb=true needs the wandb package ({e}): pip install wandb "
                "(or run `make setup`), or set logging.wandb=false"
            ) from None
        files.wandb.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner would land in output.log
        settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False)
        # the config holds no secret: a W&B key is only ever read from WANDB_API_KEY by wandb
        self.run: WandbRun = wandb.init(
            project=cfg.logging.wandb_project,
            name=cfg.name,
            dir=str(files.root),
            mode=cfg.logging.wandb_mode.value,
            config=cfg.model_dump(mode="json"),
            settings=settings,
        )

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record["update"]))

    def close(self) -> None:
        self.run.finish()


class _Guarded:
    """A sink whose failure is logged once and switches it off (the run goes on)."""

    def __init__(self, name: str, sink: UpdateSink, files: RunDirWriter) -> None:
        self.name, self.sink, self.files = name, sink, files
        self.live = True

    def _off(self, what: str, e: Exception) -> None:
        self.live = False
        self.files.write_log(f"logging: the {self.name} export failed to {what} ({e}); it is off")

    def write(self, record: dict[str, Any]) -> None:
        if self.live:
            try:
                self.sink.write(record)
            except Exception as e:  # noqa: BLE001 - an export never fails the training run
                self._off("write", e)

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception as e:  # noqa: BLE001
            self._off("close", e)


def open_sinks(cfg: RunConfig, files: RunDirWriter) -> list[UpdateSink]:
    """The exports `cfg.logging` switches on; a missing package fails here, before training."""
    sinks: list[UpdateSink] = []
    if cfg.logging.tensorboard:
        sinks.append(_Guarded("TensorBoard", TensorBoardSink(files), files))
        files.write_log(f"logging: TensorBoard event files in {files.tensorboard}")
    if cfg.logging.wandb:
        sinks.append(_Guarded("W&B", WandbSink(cfg, files), files))
        files.write_log(f"logging: W&B {cfg.logging.wandb_mode.value} run in {files.wandb}")
    return sinks
