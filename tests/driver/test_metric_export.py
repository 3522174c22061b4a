"""Metrics export (issue 36): `tsrl train grpo-toy --set logging.tensorboard=true` (and
logging.wandb=true, offline) writes TensorBoard event files and a W&B run under the run directory
whose scalars, read back with TensorBoard's EventAccumulator and from W&B's `.wandb` file, equal
metrics.jsonl line by line; a W&B API key in the environment lands in none of the run's files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from thundersync.config import ConfigError, load_run_config
from thundersync.driver.metric_sinks import scalars
from thundersync.rundir import RunFiles

TSRL = str(Path(sys.executable).parent / "tsrl")
SMALL = ["updates=2", "rollout.groups_per_update=2", "rollout.group_size=4"]
FAKE_KEY = "f4ce" * 10  # a W&B key has 40 hex characters


def _wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a `.wandb` file: a 7-byte header (':W&B', magic, version), then LevelDB
    log records (crc32 4, length 2, type 1) in 32 KiB blocks; types 1 full, 2-4 first/mid/last."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, part = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:
            yield chunk
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            yield part + chunk


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows = []
    for raw in _wandb_records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            items = rec.history.item  # a key is in `key` or, split at dots, in `nested_key`
            rows.append({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(RunFiles(run_dir).tensorboard), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("export") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_API_KEY"] = FAKE_KEY  # offline mode (the config's default) never needs it
    sets = [*SMALL, "logging.tensorboard=true", "logging.wandb=true"]
    cmd = [TSRL, "train", "grpo-toy", "--run-dir", str(run_dir), "--quiet"]
    res = subprocess.run(
        [*cmd, *(a for s in sets for a in ("--set", s))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return run_dir


def test_tensorboard_scalars_equal_metrics_jsonl(exported: Path) -> None:
    lines = RunFiles(exported).read_metrics()
    assert [m["update"] for m in lines] == [0, 1]
    tb = tensorboard_scalars(exported)
    expected_tags = {k for m in lines for k in scalars(m)}
    assert {"reward_mean", "step_s", "grad_norm", "mfu"} <= expected_tags
    assert set(tb) == expected_tags
    for tag, events in tb.items():
        got = {step: (value, wall) for step, value, wall in events}
        assert len(got) == len(events) == len(lines), (tag, events)
        for m in lines:  # event files store float32 values and the line's time as wall time
            assert got[m["update"]] == (float(np.float32(m[tag])), m["time"]), (tag, m)


def test_wandb_offline_history_equals_metrics_jsonl(exported: Path) -> None:
    lines = RunFiles(exported).read_metrics()
    history = wandb_history(exported)
    assert [h["_step"] for h in history] == [m["update"] for m in lines]
    for h, m in zip(history, lines, strict=True):
        mine = {k: v for k, v in h.items() if not k.startswith("_")}
        assert mine == scalars(m), (h, m)


def test_no_api_key_in_the_run_directory(exported: Path) -> None:
    assert (exported / "tensorboard").is_dir() and (exported / "wandb").is_dir()
    config = json.loads((exported / "config.json").read_text())
    assert config["logging"] == {
        "tensorboard": True,
        "wandb": True,
        "wandb_project": "thundersync",
        "wandb_mode": "offline",
    }
    leaked = [p for p in exported.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_exports_are_off_by_default_and_the_project_is_checked(tmp_path: Path) -> None:
    cfg = load_run_config("grpo-toy")
    assert not cfg.logging.tensorboard and not cfg.logging.wandb
    with pytest.raises(ConfigError, match="logging.wandb_project"):
        load_run_config("grpo-toy", {"logging.wandb_project": "a/b"})
    with pytest.raises(ConfigError, match="logging.wandb_mode"):
        load_run_config("grpo-toy", {"logging.wandb_mode": "cloud"})
    # what is exported: finite numbers only, the update is the step, the time the wall time
    rec = {"type": "update", "update": 3, "time": 1.5, "a": 1, "b": 0.5, "c": "x", "d": True}
    assert scalars(rec | {"e": float("nan"), "f": [1]}) == {"a": 1.0, "b": 0.5}
