"""MFU's peak: a GPU's datasheet bf16 peak, else measured here (cached), or the config's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from thundersync.config import load_run_config
from thundersync.driver.emit import UpdateTally
from thundersync.driver.metrics import UpdateTimes, update_record
from thundersync.peak import measured_peak_flops


def test_peak_is_measured_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSRL_CACHE", str(tmp_path))
    first = measured_peak_flops("cpu", threads=1)
    assert 1e7 < first < 1e14  # a CPU core does somewhere between 10 MFLOP/s and 100 TFLOP/s
    (cached,) = (tmp_path / "peak-flops").glob("*.json")
    assert measured_peak_flops("cpu", threads=1) == first  # read back, not re-measured
    cached.write_text('{"flops": 123.0}')
    assert measured_peak_flops("cpu", threads=1) == 123.0


def test_a_configured_peak_wins_over_the_measured_one() -> None:
    times = UpdateTimes(0.0, 1.0, 2.0)
    cfg = load_run_config("grpo-toy", {"mfu_peak_flops": 5e9})
    assert update_record(cfg, 0, times, UpdateTally(), None, 1, 7e9)["peak_flops"] == 5e9
    cfg = load_run_config("grpo-toy")
    assert update_record(cfg, 0, times, UpdateTally(), None, 1, 7e9)["peak_flops"] == 7e9


def test_the_peak_is_per_compute_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 learner's MFU divides by a bf16 matmul's peak, not fp32's (on a GPU the two differ
    ~15x); each dtype is measured and cached apart."""
    import torch

    monkeypatch.setenv("TSRL_CACHE", str(tmp_path))
    fp32 = measured_peak_flops("cpu", threads=1)
    bf16 = measured_peak_flops("cpu", threads=1, dtype=torch.bfloat16)
    cached = sorted(p.name for p in (tmp_path / "peak-flops").glob("*.json"))
    assert len(cached) == 2 and any("-bfloat16-" in c for c in cached), cached
    assert fp32 > 0 and bf16 > 0


def test_gpu_peaks_come_from_the_datasheet_table() -> None:
    from thundersync.peak import table_peak

    assert table_peak("NVIDIA H200") == 9.89e14
    assert table_peak("NVIDIA H100 80GB HBM3") == 9.89e14
    assert table_peak("NVIDIA H100 PCIe") == 7.56e14  # the variant before its SXM part
    assert table_peak("NVIDIA A100-SXM4-80GB") == 3.12e14
    assert table_peak("NVIDIA B200") == 2.25e15
    assert table_peak("NVIDIA GeForce RTX 4090") is None  # measured, and said so


def test_mfu_peak_says_where_it_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from thundersync.peak import mfu_peak

    monkeypatch.setenv("TSRL_CACHE", str(tmp_path))
    assert mfu_peak(5e14, torch.device("cpu")) == (5e14, "mfu_peak_flops (config)")
    flops, source = mfu_peak(None, torch.device("cpu"), torch.float32)
    assert flops > 0 and source == "cpu: measured float32 matmul"
