from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from thundersync.bus.latency import percentile
from thundersync.cli import app


def test_percentile_is_nearest_rank() -> None:
    vals = [float(v) for v in range(1, 101)]
    assert percentile(vals, 50) == 50.0
    assert percentile(vals, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_bench_bus_prints_both_backends_as_last_json_line() -> None:
    res = CliRunner().invoke(app, ["bench", "bus", "--json", "--n", "40", "--interval-ms", "0.5"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["n"] == 40
    assert summary["inproc_p99_ms"] >= summary["inproc_p50_ms"] >= 0
    assert summary["redis_p99_ms"] >= summary["redis_p50_ms"] >= 0
