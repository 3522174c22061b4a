"""`tsrl teacher check`: does the scoring backend match an HF forward, before and after a publish?

Steps: build (or take) a tiny untied model -> score fixed token sequences on the backend and with a
fresh HF forward -> one learner step (a real AdamW step on a GRPO-style loss, `learner_step`) ->
publish theta_1 through `WeightPublisher` (vLLM: in-place reload) -> score again and compare with
the stepped weights. `reload_ok` also demands that the scores really moved, so a server that kept
its old weights cannot pass.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from thundersync.teacher.scorer import HFScorer, Scorer, ScoreRequest

GOAL = 5e-3


def check_requests(vocab: int, n: int = 4, seed: int = 0) -> list[ScoreRequest]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 12 + 7 * i
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        out.append(ScoreRequest(ids, start=length // 2))
    return out


def learner_step(
    model: Any, requests: list[ScoreRequest], lr: float = 5e-2
) -> dict[str, torch.Tensor]:
    """One AdamW step on a GRPO-style loss over `requests` (fixed rewards); returns the new weights.

    The streaming learner replaces this in a run; here it only has to change the weights the way a
    real step does (every parameter that gets a gradient moves).
    """
    rewards = torch.linspace(0.0, 1.0, len(requests))
    adv = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
    model.train(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    opt.zero_grad()
    loss = torch.zeros(())
    for a, r in zip(adv, requests, strict=True):
        ids = torch.tensor([r.token_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        pos = torch.arange(r.start, len(r.token_ids))
        loss = loss - a * logp[pos - 1, ids[0, pos]].mean()
    (loss / len(requests)).backward()
    opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def run_check(
    backend: str, model_dir: str | None = None, workdir: str | None = None
) -> dict[str, Any]:
    from thundersync.hf_models import build_tiny_model, load_model
    from thundersync.rollout.hf_engine import HFEngine
    from thundersync.rollout.weight_publisher import WeightPublisher

    work = Path(workdir or tempfile.mkdtemp(prefix="tsrl-teacher-check-"))
    if model_dir is None:
        # hidden 128 -> head_dim 32: the smallest head size vLLM's CPU attention supports
        model_dir = str(build_tiny_model(work / "model", seed=0, hidden=128))
    ref = load_model(model_dir)
    reqs = check_requests(ref.config.vocab_size)
    t0 = time.monotonic()
    engine: Any
    scorer: Scorer
    if backend == "hf":
        engine = HFEngine(model_dir)
        scorer = HFScorer(engine.model)
    elif backend == "vllm":
        from thundersync.rollout.vllm_engine import VLLMEngine
        from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig
        from thundersync.teacher.scorer import VLLMScorer

        # fp32 on any device: the check compares with an fp32 HF forward to 5e-3 (bf16, the GPU
        # default, is off by more than that)
        sc = VLLMServerConfig(model=str(model_dir), dtype="float32")
        server = VLLMServer(sc, log_dir=work / "vllm")
        server.start()
        engine = VLLMEngine(server)
        scorer = VLLMScorer(server.url)
    else:
        raise ValueError(f"unknown backend {backend!r}: use 'vllm' or 'hf'")
    try:
        start_s = time.monotonic() - t0
        before = scorer.score_batch(reqs, 120)
        diff0 = _max_diff(before, HFScorer(ref).score_batch(reqs))
        state = learner_step(ref, reqs)
        pub = WeightPublisher([engine], work / "ckpt", model_dir)
        acked = pub(1, state)
        after = scorer.score_batch(reqs, 120)
        diff1 = _max_diff(after, HFScorer(ref).score_batch(reqs))
        moved = _max_diff(after, before)
        return {
            "backend": backend,
            "max_abs_logprob_diff": max(diff0, diff1),
            "reload_ok": bool(acked == 1 and diff1 <= GOAL and moved > 10 * GOAL),
            "diff_before_step": diff0,
            "diff_after_reload": diff1,
            "logprob_change_from_step": moved,
            "reload_method": pub.acks[1][0].method,
            "start_s": round(start_s, 2),
            "goal": GOAL,
        }
    finally:
        engine.close()
