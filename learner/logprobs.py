"""log pi(a_t | h_t) at scored positions only, through a chunked LM head.

Why not `log_softmax(lm_head(h))`: that materialises an [L, V] fp32 tensor for every position of
the segment and keeps it (and its softmax) alive for backward. At V = 49k and L = 4k that is
~800 MB per segment, most of it for positions nobody scores (prompts, tool output). Here the head
runs only on the scored rows, `chunk` rows at a time, and backward recomputes each chunk's logits
from the saved hidden rows: peak head memory is O(chunk * V) whatever the segment length.

The maths is the textbook one: logit_a - logsumexp(logits), with d/dlogits = onehot(a) - softmax;
in fp32 (fp64 for a float64 model) whatever the decoder's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from thundersync.learner.routing import active_router, claim

DEFAULT_CHUNK = 1024


def _head_dtype(hidden: torch.Tensor) -> torch.dtype:
    return torch.promote_types(hidden.dtype, torch.float32)  # float64 models stay float64


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        dt = _head_dtype(hidden)
        w = weight.to(dt)
        b = bias.to(dt) if bias is not None else None
        out = torch.empty(hidden.shape[0], dtype=dt, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            logits = torch.nn.functional.linear(hidden[s : s + chunk].to(dt), w, b)
            lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
            out[s : s + chunk] = logits.gather(-1, targets[s : s + chunk].view(-1, 1)).squeeze(-1)
        if weight.requires_grad and weight.device.type == "cpu":
            claim(weight)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.chunk = chunk
        return out - lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        dt = _head_dtype(hidden)
        w = weight.to(dt)
        b = bias.to(dt) if bias is not None else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w: torch.Tensor | None = None  # the first chunk writes it (no memset of [V, d])
        # host compute inside a routed backward: dW in the router's reused buffer, added into
        # the sums from there (learner.routed_ops says why)
        router = active_router() if need_w and weight.device.type == "cpu" else None
        routed = router is not None and router.routes(weight)
        grad_b = torch.zeros_like(b) if need_b and b is not None else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s : s + ctx.chunk].to(dt)
            logits = torch.nn.functional.linear(h, w, b)
            # d(logit_a - lse)/dlogits = onehot(a) - softmax, scaled by the incoming gradient
            g = torch.exp(logits.sub_(lse[s : s + ctx.chunk].view(-1, 1))).neg_()
            g.scatter_add_(
                -1,
                targets[s : s + ctx.chunk].view(-1, 1),
                torch.ones_like(lse[s : s + ctx.chunk].view(-1, 1)),
            )
            g.mul_(grad_out[s : s + ctx.chunk].view(-1, 1).to(dt))
            if grad_h is not None:
                grad_h[s : s + ctx.chunk] = (g @ w).to(hidden.dtype)
            if need_w and grad_w is not None:
                grad_w.addmm_(g.t(), h)
            elif need_w and routed:
                assert router is not None
                buf, empty = router.dense(weight, dt)
                grad_w = torch.mm(g.t(), h, out=buf) if empty else buf.addmm_(g.t(), h)
            elif need_w:
                grad_w = g.t() @ h
            if grad_b is not None:
                grad_b += g.sum(0)
        gw: torch.Tensor | None = None  # routed: dW is the router's now (added at backward's end)
        if need_w and not routed:
            gw = (grad_w if grad_w is not None else torch.zeros_like(w)).to(weight.dtype)
        gb = grad_b.to(bias.dtype) if grad_b is not None and bias is not None else None
        return grad_h, gw, gb, None, None


def head_of(model: nn.Module) -> nn.Linear:
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    head: Any = base.lm_head
    return head  # type: ignore[no-any-return]


def scored_logprobs(
    model: nn.Module,
    hidden: torch.Tensor,
    token_ids: torch.Tensor,
    scored: torch.Tensor,
    *,
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """log pi(token_{t+1} | prefix_t) for the positions t where `scored[t]` (bool, [n-1]).

    `hidden` is the decoder's last hidden state for the segment ([L, d]); position t predicts
    token t+1, so row t pairs with target token_ids[t + 1]. `token_ids` holds n = L ids (the
    segment's own) or L + 1 (its own and the next one, which its last row predicts: a turn run
    in segments scores across each cut). Returns one value per scored row.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    rows = scored.nonzero().squeeze(-1)
    head = head_of(model)
    if not hidden.shape[0] <= len(token_ids) <= hidden.shape[0] + 1:
        raise ValueError(f"{len(token_ids)} token ids for {hidden.shape[0]} hidden rows")
    h = hidden[: len(token_ids) - 1].index_select(0, rows)
    targets = token_ids[1:].index_select(0, rows)
    bias = getattr(head, "bias", None)
    out: torch.Tensor = _ChunkedTokenLogprobs.apply(h, head.weight, bias, targets, chunk)
    return out


class LogprobMismatch:
    """|engine log-prob - learner log-prob| over an update's scored tokens: the inference /
    training mismatch (sampler kernels, dtype, a stale engine would show here). A metric only:
    it never touches a gradient, and tokens without engine log-probs are skipped."""

    def __init__(self) -> None:
        self.total = 0.0
        self.max = 0.0
        self.tokens = 0

    def observe(self, learner: torch.Tensor, rollout: tuple[float, ...] | None) -> None:
        if rollout is None or len(rollout) != learner.numel() or not rollout:
            return
        with torch.no_grad():
            ref = torch.tensor(rollout, dtype=torch.float64)
            d = (learner.detach().double().cpu() - ref).abs()
        self.total += float(d.sum())
        self.max = max(self.max, float(d.max()))
        self.tokens += len(rollout)

    @property
    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else 0.0
