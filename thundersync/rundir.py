"""The run directory (docs/CONTRACTS.md): every path and file name of a run, in one place.

The driver writes it (`RunDirWriter`), the learner process adds weights, batches, checkpoints and
its error file, and the service and the benchmarks read it (`RunFiles`). Nothing else spells a
file name of a run directory.
"""

from __future__ import annotations

import json
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TextIO

from thundersync.stages import Stage


class RunStatus(StrEnum):
    """A run's state: the service's column, its API schema and the driver's status.json."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL_STATUSES


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class RunFiles:
    """Paths of one run directory and the readers of its files (no file is opened here)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ---- what the driver writes ------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def spans(self) -> Path:
        return self.root / "spans.jsonl"

    @property
    def log(self) -> Path:
        return self.root / "log.txt"

    @property
    def placement(self) -> Path:
        """The run's placement plan: which GPUs and cores each role was given."""
        return self.root / "placement.json"

    def where(self, process: str) -> Path:
        """What a process found when it started (`learner-0`, ...): its GPUs and cores."""
        return self.root / "where" / f"{process}.json"

    def record_where(self, process: str, info: dict[str, Any]) -> None:
        path = self.where(process)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def stage(self) -> Path:
        """What the driver is doing now (`thundersync.stages`), rewritten at each stage."""
        return self.root / "stage.json"

    @property
    def cancel(self) -> Path:
        return self.root / "CANCEL"

    @property
    def output_log(self) -> Path:
        """The driver's captured stdout/stderr (written by the service's launcher)."""
        return self.root / "output.log"

    @property
    def model(self) -> Path:
        """The tiny student built for a run without `model.path`."""
        return self.root / "model"

    @property
    def teacher(self) -> Path:
        """The teacher model built for the run, and the vLLM teacher server's logs."""
        return self.root / "teacher"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files of metrics.jsonl's lines (`logging.tensorboard`)."""
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        """W&B's run folders (`logging.wandb`): wandb.init(dir=root) writes root/wandb/."""
        return self.root / "wandb"

    # ---- what the learner process writes ---------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def batches(self) -> Path:
        return self.root / "batches"

    def batch_log(self, update: int, rank: int) -> Path:
        return self.batches / f"u{update:05d}-r{rank}.jsonl"

    def weights(self, version: int) -> Path:
        return self.root / "weights" / f"v{version:06d}"

    def learner_error(self, rank: int = 0) -> Path:
        return self.root / ("learner-error.txt" if rank == 0 else f"learner-error-r{rank}.txt")

    # ---- readers ---------------------------------------------------------------------------
    @property
    def cancel_requested(self) -> bool:
        return self.cancel.exists()

    def request_cancel(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.cancel.touch()

    def read_status(self) -> tuple[RunStatus, str] | None:
        """(final status, reason) from status.json; None when absent, unreadable or not final."""
        try:
            data = json.loads(self.status.read_text())
            status = RunStatus(data["status"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not status.final:
            return None
        return status, str(data.get("reason") or "")

    def read_stage(self) -> str | None:
        """The current stage's status line from stage.json; None when absent or unreadable."""
        try:
            data = json.loads(self.stage.read_text())
            return Stage(**data).line()
        except (OSError, ValueError, TypeError):
            return None

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete line of metrics.jsonl (update records)."""
        if not self.metrics.exists():
            return []
        return [json.loads(x) for x in self.metrics.read_text().splitlines() if x.strip()]

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def batch_logs(self) -> dict[int, list[Path]]:
        """Every rank's batch log, by update."""
        out: dict[int, list[Path]] = {}
        for path in sorted(self.batches.glob("u*-r*.jsonl")):
            out.setdefault(int(path.name[1:6]), []).append(path)
        return dict(sorted(out.items()))

    def learner_error_detail(self, ranks: int = 1) -> str | None:
        """The last line of the first learner rank's error file, if any rank wrote one."""
        for rank in range(ranks):
            path = self.learner_error(rank)
            if path.exists():
                lines = path.read_text().strip().splitlines()
                return lines[-1] if lines else f"{path.name} is empty"
        return None

    def has_driver_output(self) -> bool:
        """Whether a driver has written anything here (the service's restart check)."""
        files = (self.metrics, self.spans, self.log, self.status, self.output_log)
        return any(p.exists() and p.stat().st_size > 0 for p in files)


class UpdateSink(Protocol):
    """Another destination of metrics.jsonl's lines (TensorBoard, W&B: driver/metric_sinks)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class RunDirWriter(RunFiles):
    """The driver's side: appends metrics, spans and log lines, writes status.json atomically."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._metrics: TextIO = open(self.metrics, "a", buffering=1)  # noqa: SIM115
        self._spans: TextIO = open(self.spans, "a", buffering=1)  # noqa: SIM115
        self._log: TextIO = open(self.log, "a", buffering=1)  # noqa: SIM115
        self._last_stage: tuple[str, str] | None = None
        self._stage_lock = threading.Lock()
        self.sinks: list[UpdateSink] = []  # each gets every metrics line after the file does

    def write_log(self, msg: str) -> None:
        self._log.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    def write_stage(self, stage: Stage) -> None:
        """stage.json (atomically), and a `stage:` log line when the stage itself changes (not
        only its step)."""
        with self._stage_lock:  # stages come from set-up threads too (parallel vLLM starts)
            tmp = self.stage.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(stage.to_json()))
            tmp.replace(self.stage)
            if (stage.kind, stage.detail) != self._last_stage:
                self._last_stage = (stage.kind, stage.detail)
                self.write_log(f"stage: {stage.kind}: {stage.line()}")

    def write_update(self, record: dict[str, Any]) -> None:
        line = {"type": "update", **record}
        self._metrics.write(json.dumps(line) + "\n")
        for sink in self.sinks:
            sink.write(line)

    def write_spans(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self._spans.write(json.dumps(r) + "\n")

    def write_status(self, status: RunStatus, reason: str = "") -> None:
        tmp = self.status.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"status": status.value, "reason": reason}))
        tmp.replace(self.status)

    def write_config(self, cfg_json: str) -> None:
        self.config.write_text(cfg_json)

    def write_placement(self, plan: dict[str, Any]) -> None:
        self.placement.write_text(json.dumps(plan, indent=2))

    def drop_updates_from(self, update: int) -> int:
        """Resume: forget the metrics and spans of updates >= `update` (they are redone), so the
        run directory holds each update once. Rewrites both files atomically; returns how many
        lines were dropped. The service never ingests a directory while it is resumed."""
        dropped = 0
        for path, handle in ((self.metrics, "_metrics"), (self.spans, "_spans")):
            getattr(self, handle).close()
            lines = path.read_text().splitlines() if path.exists() else []
            kept = []
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    dropped += 1  # a torn last line of the killed run
                    continue
                if isinstance(rec.get("update"), int) and rec["update"] >= update:
                    dropped += 1
                else:
                    kept.append(line)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text("".join(x + "\n" for x in kept))
            tmp.replace(path)
            setattr(self, handle, open(path, "a", buffering=1))  # noqa: SIM115
        return dropped

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        for f in (self._metrics, self._spans, self._log):
            f.close()
