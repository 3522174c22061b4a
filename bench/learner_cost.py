"""`tsrl bench learner-cost`: the same batch through stream and sync, learner cost compared.

compute_ratio: learner busy time (stream / sync), with counted forward tokens beside it; both use
the same cut-boundary engine, so the ratio measures what streaming adds (admission stalls do not
count as busy time). peak_rss_ratio: each schedule runs in a fresh subprocess with admission cap 1
and reports its peak RSS. The textbook full-backward reference is timed too, for scale.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _one(schedule: str, model_dir: str, seed: int) -> dict[str, Any]:
    from learner.replay import make_grpo_batch
    from learner.trainer import Learner
    from tsrl.config import Schedule, load_run_config
    from tsrl.models import load_model

    torch.set_num_threads(1)
    cfg = load_run_config(data={"objective": "grpo", "learner": {"max_open_groups": 1}})
    batch = make_grpo_batch(random.Random(seed), vocab=512, groups=4, group_size=8)
    learner = Learner(load_model(model_dir), cfg)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    engine = learner.open_update(Schedule(schedule))
    for g in batch.groups:
        engine.register_group(g)
    busy = 0.0
    for ready, item in batch.events:
        engine.submit(item, ready)
        t = time.perf_counter()
        engine.drain()
        busy += time.perf_counter() - t
    engine.close_batch()
    t = time.perf_counter()
    engine.drain()
    busy += time.perf_counter() - t
    learner.step(engine)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "busy_s": busy,
        "tokens_forward": engine.counters["tokens_forward"],
        "peak_rss_kb": rss,
        "setup_rss_kb": rss0,
    }


def _reference_time(model_dir: str, seed: int) -> float:
    from learner.reference import reference_loss
    from learner.replay import make_grpo_batch
    from tsrl.models import load_model

    batch = make_grpo_batch(random.Random(seed), vocab=512, groups=4, group_size=8)
    model = load_model(model_dir)
    t = time.perf_counter()
    reference_loss(model, batch).backward()
    return time.perf_counter() - t


def run_learner_cost(seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    from tsrl.models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "m", seed=0))
        results: dict[str, list[dict[str, Any]]] = {"sync": [], "stream": []}
        for _ in range(repeats):  # interleaved, so drift on a noisy machine hits both alike
            for sched in ("sync", "stream"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.learner_cost", sched, model_dir, str(seed)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[sched].append(json.loads(out.stdout.strip().splitlines()[-1]))
        torch.set_num_threads(1)
        ref_s = min(_reference_time(model_dir, seed) for _ in range(repeats))

    def best(s: str, k: str) -> float:
        return float(min(r[k] for r in results[s]))

    return {
        "compute_ratio": best("stream", "busy_s") / best("sync", "busy_s"),
        "flops_ratio": best("stream", "tokens_forward") / best("sync", "tokens_forward"),
        "peak_rss_ratio": best("stream", "peak_rss_kb") / best("sync", "peak_rss_kb"),
        "sync_busy_s": best("sync", "busy_s"),
        "stream_busy_s": best("stream", "busy_s"),
        "reference_full_backward_s": ref_s,
        "sync_peak_rss_mb": best("sync", "peak_rss_kb") / 1024,
        "stream_peak_rss_mb": best("stream", "peak_rss_kb") / 1024,
        "max_open_groups": 1,
    }


if __name__ == "__main__":
    print(json.dumps(_one(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
