"""Teacher cost per OPD turn vs turns: full-context scoring against incremental scoring.

One synthetic trajectory per turn count T: a prompt, then T turns of (observation, action) token
segments, scored the way the agent loop asks (turn j: the whole context so far, the action's
span). Full-context scoring (HFScorer) re-reads the whole trajectory every turn, so its tokens and
seconds per turn grow with T; incremental scoring (IncrementalHFScorer) feeds each turn's new
tokens on the trajectory's kept K/V, so they should stay flat. Both run in the same round, one
after the other, on the same frozen tiny teacher; medians over rounds.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from thundersync.teacher.scorer import ScoreRequest

PROMPT_TOKENS = 16
EXACT_TOL = 1e-5  # float32 tiny model: incremental vs full log-probs
FLAT_GOAL = 1.5  # incremental CPU seconds per turn, most turns over fewest


def trajectory(vocab: int, turns: int, tokens_per_turn: int, seed: int) -> list[ScoreRequest]:
    """The agent loop's score requests for one trajectory (turn 0 has no observation)."""
    rng = random.Random(seed)
    obs_len = tokens_per_turn // 2
    ctx = [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
    reqs = []
    for j in range(turns):
        if j:
            ctx += [rng.randrange(vocab) for _ in range(obs_len)]
        start = len(ctx)
        ctx += [rng.randrange(vocab) for _ in range(tokens_per_turn - obs_len)]
        reqs.append(ScoreRequest(list(ctx), start))
    return reqs


_Run = tuple[float, float, int, list[list[float]]]  # wall s, CPU s, tokens fed, scores


def _full(model: Any, reqs: Sequence[ScoreRequest]) -> _Run:
    from thundersync.teacher.scorer import HFScorer

    sc = HFScorer(model)
    t0, c0 = time.perf_counter(), time.thread_time()
    out = [sc.score_batch([r])[0] for r in reqs]
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    return dt, dc, sum(len(r.token_ids) for r in reqs), out


def _incremental(model: Any, reqs: Sequence[ScoreRequest]) -> _Run:
    from thundersync.teacher.incremental import IncrementalHFScorer

    sc = IncrementalHFScorer(model, max_open=1)
    key = ("bench", len(reqs))
    t0, c0 = time.perf_counter(), time.thread_time()
    out = [sc.score_batch([ScoreRequest(r.token_ids, r.start, key)])[0] for r in reqs]
    sc.release(key)
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    assert sc.stats.hits == len(reqs) - 1, sc.stats  # every turn after the first reused the cache
    return dt, dc, sc.stats.tokens, out


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def run_teacher_cost(
    turns: Sequence[int] = (2, 8, 16, 32, 64),
    *,
    tokens_per_turn: int = 12,
    rounds: int = 7,
    seed: int = 0,
    threads: int = 1,
    model_dir: str | Path | None = None,
) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    from thundersync.hf_models import build_tiny_model, load_model

    ts = sorted(set(turns))
    if len(ts) < 2 or ts[0] < 1:
        raise ValueError(f"turns={list(turns)}: give at least two positive turn counts")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its unterminated line would glue onto the JSON line
    try:
        with tempfile.TemporaryDirectory(prefix="tsrl-teacher-cost-") as tmp:
            path = Path(model_dir) if model_dir else build_tiny_model(Path(tmp) / "t", seed=seed)
            model = load_model(path, dtype=torch.float32)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # one core per scorer: less noise on a shared machine
    try:
        res = _measure(model, ts, tokens_per_turn, rounds, seed)
    finally:
        torch.set_num_threads(before)  # the caller's process (e.g. a test run) keeps its own
    res["threads"] = threads
    return res


def _measure(
    model: Any, ts: list[int], tokens_per_turn: int, rounds: int, seed: int
) -> dict[str, Any]:
    vocab = int(model.config.vocab_size)
    trajs = {t: trajectory(vocab, t, tokens_per_turn, seed + t) for t in ts}
    _full(model, trajs[ts[0]])  # warm-up: first forwards allocate and pick kernels
    _incremental(model, trajs[ts[0]])
    kinds = ("full", "incremental", "full_cpu", "incremental_cpu")
    secs: dict[str, dict[int, list[float]]] = {k: {t: [] for t in ts} for k in kinds}
    tokens: dict[str, dict[int, float]] = {"full": {}, "incremental": {}}
    max_diff = 0.0
    for _ in range(rounds):
        for t in ts:
            f_s, f_cpu, f_tok, f_out = _full(model, trajs[t])
            i_s, i_cpu, i_tok, i_out = _incremental(model, trajs[t])
            for k, v in zip(kinds, (f_s, i_s, f_cpu, i_cpu), strict=True):
                secs[k][t].append(v / t)
            tokens["full"][t], tokens["incremental"][t] = f_tok / t, i_tok / t
            max_diff = max(max_diff, _max_diff(f_out, i_out))
    med = {k: {t: statistics.median(v[t]) for t in ts} for k, v in secs.items()}
    lo, hi = ts[0], ts[-1]
    rows = [
        {"turns": t}
        | {f"{k}_s_per_turn": med[k][t] for k in kinds}
        | {f"{k}_tokens_per_turn": tokens[k][t] for k in tokens}
        for t in ts
    ]
    res: dict[str, Any] = {
        "rows": rows,
        "tokens_per_turn": tokens_per_turn,
        "prompt_tokens": PROMPT_TOKENS,
        "rounds": rounds,
    }
    for k in kinds:  # e.g. incremental_turn_cost_ratio_64_vs_2 (wall), ..._cpu_turn_cost_...
        res[f"{k}_turn_cost_ratio_{hi}_vs_{lo}"] = med[k][hi] / med[k][lo]
    for k in tokens:
        res[f"{k}_tokens_per_turn_ratio_{hi}_vs_{lo}"] = tokens[k][hi] / tokens[k][lo]
    res[f"speedup_at_{hi}_turns"] = med["full"][hi] / med["incremental"][hi]
    res["max_abs_diff_vs_full"] = max_diff
    # the flatness goal is read on CPU time: wall time on a loaded, shared machine is mostly noise
    cpu_ratio = res[f"incremental_cpu_turn_cost_ratio_{hi}_vs_{lo}"]
    res["goal_met"] = cpu_ratio <= FLAT_GOAL and max_diff <= EXACT_TOL
    return res
