"""Host adds split over threads give the single-thread add's bits (learner/host_adds.py), and
`tsrl bench host-adds` reports its throughput per thread count."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.learner.host_adds import ALIGN, parallel_add_, pieces


@pytest.mark.parametrize("n", [1, ALIGN - 1, ALIGN + 1, 3 * ALIGN + 7, (1 << 20) + 13])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_split_add_equals_one_add_bit_for_bit(n: int, workers: int) -> None:
    g = torch.Generator().manual_seed(n)
    dst, src = torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-3
    want = dst.clone().add_(src, alpha=-0.731)
    with ThreadPoolExecutor(workers) as pool:
        got = parallel_add_(dst.clone(), src, -0.731, pool)
    assert torch.equal(got, want)
    cuts = pieces(n, workers)
    assert cuts[0][0] == 0 and cuts[-1][1] == n and all(a % ALIGN == 0 for a, _ in cuts)
    assert all(b == c for (_, b), (c, _) in zip(cuts, cuts[1:], strict=False))


def test_bench_host_adds_reports_every_thread_count() -> None:
    args = ["bench", "host-adds", "--elements", "300000", "--threads", "1", "--threads", "2"]
    res = CliRunner().invoke(app, [*args, "--rounds", "2", "--json"])
    assert res.exit_code == 0, res.output
    last = json.loads(res.output.strip().splitlines()[-1])
    rows = [json.loads(x) for x in res.output.strip().splitlines()[:-1]]
    assert [r["threads"] for r in rows] == [1, 2] and last["bitwise_equal"] is True
    assert all(r["split_gb_s"] > 0 and r["s_per_trajectory_8b"] > 0 for r in rows)


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_a_learner_with_host_threads_steps_the_same_bits(
    objective: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`learner.host_threads: 2` splits the accumulators' adds across threads; the replayed
    updates' parameters and gradients equal the one-thread learner's bit for bit."""
    import thundersync.learner.accumulators as acc
    from thundersync.bench.equivalence import _train, bench_config, make_batches, make_models
    from thundersync.config import Objective, Schedule

    calls = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return parallel_add_(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(acc, "parallel_add_", counted)
    obj = Objective(objective)
    student, teacher = make_models(tmp_path)
    batches = make_batches(obj, 2, teacher, 0.0, seed=3)
    one = bench_config(obj, 1)
    two = one.model_copy(deep=True)
    two.learner.host_threads = 2
    a = _train(student, one, batches, Schedule.STREAM)
    assert not calls  # one thread: the plain add
    b = _train(student, two, batches, Schedule.STREAM)
    assert calls  # the split path ran
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a["grads"], b["grads"], strict=True))


def test_more_host_threads_than_cores_is_refused_by_field(tiny_model_dir: Path) -> None:
    import os

    from thundersync.config import load_run_config
    from thundersync.hf_models import load_model
    from thundersync.learner.trainer import Learner

    cores = len(os.sched_getaffinity(0))
    cfg = load_run_config("grpo-toy", {"learner.host_threads": cores + 1})
    with pytest.raises(ValueError, match=rf"learner.host_threads={cores + 1} but this learner"):
        Learner(load_model(tiny_model_dir), cfg)
