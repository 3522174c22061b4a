"""The run directory of docs/CONTRACTS.md: metrics.jsonl, spans.jsonl, log.txt, status.json."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        self._spans = open(self.path / "spans.jsonl", "a", buffering=1)  # noqa: SIM115
        self._log = open(self.path / "log.txt", "a", buffering=1)  # noqa: SIM115

    def log(self, msg: str) -> None:
        self._log.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    def update(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps({"type": "update", **record}) + "\n")

    def spans(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self._spans.write(json.dumps(r) + "\n")

    def status(self, status: str, reason: str = "") -> None:
        tmp = self.path / "status.json.tmp"
        tmp.write_text(json.dumps({"status": status, "reason": reason}))
        tmp.replace(self.path / "status.json")

    @property
    def cancel_requested(self) -> bool:
        return (self.path / "CANCEL").exists()

    def close(self) -> None:
        for f in (self._metrics, self._spans, self._log):
            f.close()
