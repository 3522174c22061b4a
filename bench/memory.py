"""`tsrl bench memory`: peak learner memory of stream, sync and a textbook learner, same batch.

GRPO against the continuation length, OPD against the number of turns. Each point and learner
runs in a fresh subprocess; peak memory is RSS (`ru_maxrss`) on CPU and
`torch.cuda.max_memory_allocated` on CUDA, reported above the process baseline (after the model
and the learner are built, before the update), the update's AdamW step included. The textbook
learner is one plain forward + backward per [prompt; continuation] (OPD: per whole trajectory)
with no streaming state, then its AdamW step; none of the three clips (the same update). Each
point also reports the stream's time over the textbook's (`time_vs_textbook`; goal <= 1.1 from
4096 tokens up, `time_goal_met`) and OPD learner seconds per turn. Every point is the median of `repeats` rounds (one RSS
reading of a ~60 MB process moves by several MB from run to run).
"""

from __future__ import annotations

import json
import math
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

LEARNERS = ("stream", "sync", "textbook")
GRPO_LENGTHS = (64, 256, 1024, 4096, 8192)
LONG = 4096  # the time goal holds from here up: stream within 1.1x of the textbook's time
OPD_TURNS = (2, 8, 32, 64)


def _opd_batch(seed: int, vocab: int, turns: int, ctx: int = 12, act: int = 20) -> Any:
    from thundersync.config import Objective
    from thundersync.learner.batch_replay import LoggedBatch
    from thundersync.learner.sources import OpdClose, OpdTurn

    rng = random.Random(seed)
    b = LoggedBatch(Objective.OPD)
    b.trajectories.append("o0")
    for j in range(turns):
        toks = tuple(rng.randrange(8, vocab) for _ in range(ctx + act))
        mask = (0,) * ctx + (1,) * act
        teacher = tuple(-rng.uniform(0.5, 5.0) for _ in range(act))
        b.events.append((float(j), OpdTurn(f"o0/t{j}", "o0", j, toks, mask, teacher)))
    b.events.append((float(turns), OpdClose("o0/close", "o0", turns)))
    return b


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _textbook_grpo(model: Any, batch: Any) -> None:
    from thundersync.bench.learner_cost import _textbook

    _textbook(model, batch, padded=False)


def _textbook_opd(model: Any, batch: Any) -> None:
    from thundersync.learner.sources import OpdTurn

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    turns = sorted((it for _, it in batch.events if isinstance(it, OpdTurn)), key=lambda t: t.turn)
    ids = torch.tensor([x for t in turns for x in t.token_ids], device=model.device).view(1, -1)
    mask = torch.tensor([m for t in turns for m in t.action_mask][1:], dtype=torch.bool)
    teacher = torch.tensor([x for t in turns for x in t.teacher_logprobs], device=model.device)
    logits = model(input_ids=ids).logits[0, :-1][mask.to(ids.device)]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:][mask.to(ids.device)][:, None])
    lp = lp[:, 0]
    (-((teacher - lp).detach() * lp).sum() / len(lp)).backward()
    opt.step()


def _one(
    learner_kind: str,
    objective: str,
    x: int,
    model_dir: str,
    opd_mode: str,
    checkpointing: str = "none",
) -> dict[str, Any]:
    from thundersync.bench.learner_cost import make_batch
    from thundersync.config import Schedule, load_run_config
    from thundersync.hf_models import load_model
    from thundersync.learner.batch_replay import replay_sources
    from thundersync.learner.trainer import Learner

    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model: Any = load_model(model_dir)
    model.to(device)
    model.eval()
    vocab = int(model.config.vocab_size)
    if objective == "grpo":
        batch = make_batch(0, vocab, groups=2, size=4, prompt=64, response=x)
    else:
        batch = _opd_batch(0, vocab, turns=x)
    learner = None
    if learner_kind != "textbook":
        cfg = load_run_config(
            data={
                "objective": objective,
                # the textbook learner takes a plain AdamW step: no clipping on either side
                "optim": {"max_grad_norm": 1e9},
                "learner": {
                    "max_open_groups": 1,
                    "opd_turn_graphs": opd_mode,
                    "activation_checkpointing": checkpointing,
                },
            }
        )
        learner = Learner(model, cfg)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = _peak_mb(device)
    t0 = time.perf_counter()
    if learner is None:
        (_textbook_grpo if objective == "grpo" else _textbook_opd)(model, batch)
    else:
        learner.step(replay_sources(learner, batch, Schedule(learner_kind)))
    busy = time.perf_counter() - t0
    return {"above_baseline_mb": _peak_mb(device) - base, "busy_s": busy}


def _growth(xs: list[int], ys: list[float]) -> tuple[str, float]:
    """Log-log slope of memory vs turns: the fitted exponent and its class."""
    if len(set(xs)) < 2:
        return "unknown", float("nan")  # one turn count: nothing to fit
    pts = [(math.log(x), math.log(max(y, 1e-3))) for x, y in zip(xs, ys, strict=True)]
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    kind = (
        "constant"
        if slope < 0.15
        else "sublinear"
        if slope < 0.85
        else "linear"
        if slope <= 1.15
        else "superlinear"
    )
    return kind, slope


def run_memory(
    lengths: tuple[int, ...] = GRPO_LENGTHS,
    turns: tuple[int, ...] = OPD_TURNS,
    opd_mode: str = "recompute",
    repeats: int = 3,
    checkpointing: str = "none",
) -> dict[str, Any]:
    from thundersync.hf_models import build_tiny_model

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "m", seed=0, hidden=256, layers=4))
        points = [("grpo", n) for n in lengths] + [("opd", j) for j in turns]
        for objective, x in points:
            row: dict[str, Any] = {"objective": objective, "x": x}
            runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in LEARNERS}
            for _ in range(repeats):  # rounds interleaved: drift hits the three learners alike
                for kind in LEARNERS:
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "bench.memory",
                            kind,
                            objective,
                            str(x),
                            model_dir,
                            opd_mode,
                            checkpointing,
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
            for kind in LEARNERS:
                row[f"{kind}_mb"] = statistics.median(r["above_baseline_mb"] for r in runs[kind])
                row[f"{kind}_s"] = statistics.median(r["busy_s"] for r in runs[kind])
            row["stream_vs_sync"] = row["stream_mb"] / max(row["sync_mb"], 1e-3)
            row["stream_vs_textbook"] = row["stream_mb"] / max(row["textbook_mb"], 1e-3)
            row["time_vs_textbook"] = row["stream_s"] / max(row["textbook_s"], 1e-9)
            if objective == "opd":
                row["stream_s_per_turn"] = row["stream_s"] / x
            rows.append(row)
    opd = [r for r in rows if r["objective"] == "opd"]
    kind, slope = _growth([r["x"] for r in opd], [r["stream_mb"] for r in opd])
    per_turn = {r["x"]: r["stream_s_per_turn"] for r in opd}
    grpo_time = {r["x"]: r["time_vs_textbook"] for r in rows if r["objective"] == "grpo"}
    long = [v for n, v in grpo_time.items() if n >= LONG]
    summary = {
        "points": rows,
        "grpo_time_vs_textbook": grpo_time,
        "max_time_vs_textbook_long": max(long) if long else None,
        "time_goal_met": bool(long) and max(long) <= 1.10,
        "opd_turn_graphs": opd_mode,
        "activation_checkpointing": checkpointing,
        "rounds": repeats,
        "max_peak_ratio": max(r["stream_vs_sync"] for r in rows),
        "max_peak_ratio_vs_textbook": max(r["stream_vs_textbook"] for r in rows),
        "opd_memory_growth": kind,
        "opd_memory_slope": slope,
        "opd_turn_time_ratio_64_vs_2": per_turn.get(max(per_turn), 0.0)
        / max(per_turn.get(min(per_turn), 1e-9), 1e-9),
    }
    summary["goal_met"] = (
        summary["max_peak_ratio"] <= 1.10
        and summary["max_peak_ratio_vs_textbook"] <= 1.5
        and kind in ("constant", "sublinear", "linear", "unknown")
    )
    return summary


if __name__ == "__main__":
    a = sys.argv
    print(json.dumps(_one(a[1], a[2], int(a[3]), a[4], a[5], a[6])))
