"""`tsrl bench learner-cost`: one GRPO batch through stream, sync and textbook learners.

compute_ratio: learner busy time (stream / sync); both use the cut-boundary engine, so it measures
what streaming adds (admission stalls do not count as busy time). bookkeeping_share: the stream
learner's full-parameter vector work (accumulator adds, copies; timed by the engine) over its busy
time. throughput_vs_textbook: batch tokens per second of the stream learner over the best
textbook learner's on the same batch and threads (`textbook_seq`: one plain forward + backward
per [prompt; continuation]; `textbook_padded`: one padded forward + backward per group); both
include the optimizer step. Every variant runs in a fresh subprocess (peak RSS is per process),
rounds interleaved so drift on a noisy machine hits all alike. The two time ratios are paired: one
ratio per round, from that round's runs (a minute apart), and the median of those; a ratio of
medians would mix runs from different minutes of a machine whose speed drifts by 30% or more.
Times, shares and RSS are medians over rounds.
"""

from __future__ import annotations

import json
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

MODES = ("sync", "stream", "textbook_seq", "textbook_padded")


def make_batch(seed: int, vocab: int, groups: int, size: int, prompt: int, response: int) -> Any:
    """GRPO groups with prompts of ~`prompt` and responses of ~`response` tokens."""
    from thundersync.config import Objective
    from thundersync.learner.batch_replay import LoggedBatch
    from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward

    rng = random.Random(seed)
    b = LoggedBatch(Objective.GRPO)
    for gi in range(groups):
        gid = f"g{gi}"
        p = tuple(rng.randrange(8, vocab) for _ in range(rng.randint(prompt // 2, prompt)))
        b.groups.append(GrpoGroupSpec(gid, p, size))
        for i in range(size):
            n = rng.randint(response // 2, response)
            resp = tuple(rng.randrange(8, vocab) for _ in range(n))
            mask = tuple(0 if rng.random() < 0.2 else 1 for _ in range(n))
            t = rng.uniform(0, 10)
            # as the driver sends a finished trajectory: its reward, then its content
            b.events.append((t, GrpoReward(f"{gid}/r{i}", gid, i, rng.choice([0.0, 1.0]))))
            b.events.append((t, GrpoContent(f"{gid}/t{i}", gid, i, resp, mask)))
    b.events.sort(key=lambda e: e[0])
    return b


def _textbook(model: Any, batch: Any, padded: bool) -> tuple[float, int]:
    """A plain learner: full [prompt; continuation] forwards, one backward each, AdamW step."""
    from thundersync.config import Estimator
    from thundersync.learner.objectives import advantages
    from thundersync.learner.sources import GrpoContent, GrpoReward

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    items = [it for _, it in batch.events]
    t0 = time.perf_counter()
    for g in batch.groups:
        cont = {
            it.index: it
            for it in items
            if isinstance(it, GrpoContent) and it.group_id == g.group_id
        }
        rew = {
            it.index: it.reward
            for it in items
            if isinstance(it, GrpoReward) and it.group_id == g.group_id
        }
        adv = advantages(Estimator.GRPO, [rew[i] for i in range(g.size)])
        seqs = [[*g.prompt_ids, *cont[i].response_ids] for i in range(g.size)]
        masks = [[0] * (len(g.prompt_ids) - 1) + list(cont[i].response_mask) for i in range(g.size)]
        chunks = [list(range(g.size))] if padded else [[i] for i in range(g.size)]
        for idx in chunks:
            width = max(len(seqs[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            att = torch.zeros(len(idx), width, dtype=torch.long)
            sc = torch.zeros(len(idx), width - 1)
            for r, i in enumerate(idx):
                ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
                att[r, : len(seqs[i])] = 1
                m = torch.tensor(masks[i], dtype=torch.float32)
                sc[r, : len(m)] = m * adv[i] / max(float(m.sum()), 1.0) / g.size
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
            (-(lp * sc).sum()).backward()
    opt.step()
    tokens = sum(
        len(g.prompt_ids) + len(c.response_ids)
        for g in batch.groups
        for c in items
        if isinstance(c, GrpoContent) and c.group_id == g.group_id
    )
    return time.perf_counter() - t0, tokens


def _one(mode: str, model_dir: str, seed: int, shape: dict[str, int]) -> dict[str, Any]:
    from thundersync.config import Schedule, load_run_config
    from thundersync.hf_models import load_model
    from thundersync.learner.trainer import Learner

    torch.set_num_threads(shape["threads"])
    model = load_model(model_dir)
    vocab = int(model.config.vocab_size)
    batch = make_batch(
        seed, vocab, shape["groups"], shape["size"], shape["prompt"], shape["response"]
    )
    tokens = sum(len(g.prompt_ids) for g in batch.groups for _ in range(g.size))
    tokens += sum(len(it.response_ids) for _, it in batch.events if hasattr(it, "response_ids"))
    model.eval()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if mode.startswith("textbook"):
        busy, tokens = _textbook(model, batch, padded=mode == "textbook_padded")
        bookkeeping = adds = backward = 0.0
    else:
        cfg = load_run_config(data={"objective": "grpo", "learner": {"max_open_groups": 1}})
        learner = Learner(model, cfg)
        engine = learner.open_update(Schedule(mode))
        for g in batch.groups:
            engine.register_group(g)
        busy = 0.0
        for ready, item in batch.events:
            engine.submit(item, ready)
            t = time.perf_counter()
            engine.drain()
            busy += time.perf_counter() - t
        t = time.perf_counter()
        engine.close_batch()
        engine.drain()
        learner.step(engine)
        busy += time.perf_counter() - t
        bookkeeping = engine.timers["bookkeeping"]
        adds, backward = engine.timers["host_adds"], engine.timers["backward"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "busy_s": busy,
        "bookkeeping_s": bookkeeping,
        "host_add_s": adds,  # the adds of the sources' gradients into the host sums
        "backward_s": backward,  # the routed backwards, those adds included
        "sources": sum(g.size for g in batch.groups),
        "tokens": tokens,
        "peak_rss_mb": rss / 1024,
        "above_baseline_mb": (rss - rss0) / 1024,
    }


def run_learner_cost(
    seed: int = 0, repeats: int = 3, model: str = "tiny", shape: dict[str, int] | None = None
) -> dict[str, Any]:
    from thundersync.hf_models import build_tiny_model

    shape = shape or (
        {"groups": 2, "size": 4, "prompt": 128, "response": 128, "threads": 2}
        if model == "smollm2"
        else {"groups": 4, "size": 8, "prompt": 16, "response": 24, "threads": 1}
    )
    with tempfile.TemporaryDirectory() as tmp:
        if model == "smollm2":
            from thundersync.smollm2 import smollm2_dir

            model_dir = str(smollm2_dir())
        else:
            model_dir = str(build_tiny_model(Path(tmp) / "m", seed=0))
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for _ in range(repeats):
            for mode in MODES:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.learner_cost",
                        mode,
                        model_dir,
                        str(seed),
                        json.dumps(shape),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[mode]))

    def paired(f: Any) -> list[float]:  # one ratio per round, from runs minutes apart
        return [f(*(results[m][r]["busy_s"] for m in MODES)) for r in range(repeats)]

    vs_textbook = paired(lambda sync, stream, seq, padded: min(seq, padded) / stream)
    compute = paired(lambda sync, stream, seq, padded: stream / sync)
    return {
        "model": model,
        "shape": shape,
        "rounds": repeats,
        "compute_ratio": statistics.median(compute),
        "bookkeeping_share": med("stream", "bookkeeping_s") / med("stream", "busy_s"),
        "host_add_s_per_source": med("stream", "host_add_s") / med("stream", "sources"),
        "host_add_share_of_backward": med("stream", "host_add_s") / med("stream", "backward_s"),
        "throughput_vs_textbook": statistics.median(vs_textbook),
        "throughput_vs_textbook_rounds": [round(x, 3) for x in vs_textbook],
        "compute_ratio_rounds": [round(x, 3) for x in compute],
        "peak_rss_ratio": med("stream", "peak_rss_mb") / med("sync", "peak_rss_mb"),
        "peak_above_baseline_vs_textbook": med("stream", "above_baseline_mb")
        / min(
            med("textbook_seq", "above_baseline_mb"), med("textbook_padded", "above_baseline_mb")
        ),
        **{f"{m}_busy_s": med(m, "busy_s") for m in MODES},
        **{f"{m}_peak_rss_mb": med(m, "peak_rss_mb") for m in MODES},
        "stream_tokens_per_s": med("stream", "tokens") / med("stream", "busy_s"),
        "max_open_groups": 1,
    }


if __name__ == "__main__":
    print(json.dumps(_one(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))))
