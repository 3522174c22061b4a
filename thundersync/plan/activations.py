"""Bytes autograd keeps per token for one learner segment (`learner.boundary.run_segment`).

Why per-tensor terms and not a rule of thumb: what a stock HF decoder layer saves for backward
depends on the dtype (RMSNorm saves an fp32 copy of its input even in bf16), the family (Qwen3's
q/k norms) and on how the segment attends to past K/V (`learner.attention`): a past no longer
than the segment pads the query in front (SDPA saves the padded query, output and logsumexp
rows, K/V at kv_dim); a longer past passes a lower-right causal bias with K/V repeated to every
query head (`repeat_kv`, q_dim instead of kv_dim), which off CUDA is an [L, P+L] mask that SDPA
saves per layer in the compute dtype. The terms below were read off
the saved tensors of real forwards (`torch.autograd.graph.saved_tensors_hooks`) and match them to
the byte on tiny Llama / Qwen3 models in fp32 and bf16; `tsrl bench plan-check` re-measures them.
"""

from __future__ import annotations

from thundersync.plan.shape import ModelShape

F32 = 4


def layer_own(s: ModelShape, b: int) -> int:
    """Saved bytes per own token per decoder layer, K/V excluded (see `layer_kv`).

    Two RMSNorms: an fp32 (or wider) copy of the input, the normalised output in the compute
    dtype, a per-token rsqrt; q after RoPE, SDPA's output, the o_proj input and one more
    q-sized tensor; SDPA's fp32 logsumexp per head; the MLP's gate, up, SiLU(gate) and the
    product (4 x intermediate); Qwen3's q/k norms like the RMSNorms above, per head."""
    wide = max(b, F32)
    norms = 2 * (wide * s.hidden + b * s.hidden + F32)
    attn = 4 * b * s.q_dim + F32 * s.heads
    mlp = 4 * b * s.intermediate
    qk = (wide + b) * (s.q_dim + s.kv_dim) + F32 * (s.heads + s.kv_heads) if s.qk_norm else 0
    return norms + attn + mlp + qk


def layer_kv(s: ModelShape, b: int, masked: bool) -> int:
    """K/V bytes SDPA saves per context token per layer: its own K/V, or (a past longer than the
    segment) K/V repeated to the query heads."""
    return 2 * b * (s.q_dim if masked else s.kv_dim)


def padded_row(s: ModelShape, b: int) -> int:
    """Per padding row per layer (a past no longer than the segment): the zero query row, its
    SDPA output row and its fp32 logsumexp per head."""
    return 2 * b * s.q_dim + F32 * s.heads


def forward_own(s: ModelShape, b: int) -> int:
    """Per token, once per forward: the final norm, the scored hidden rows the chunked LM head
    saves, RoPE's cos / sin, and the int64 ids / positions / targets with the head's fp32 lse."""
    return max(b, F32) * s.hidden + b * s.hidden + F32 + b * s.hidden + 2 * b * s.head_dim + 28


def segment_bytes(
    s: ModelShape, b: int, own: int, past: int, cuda: bool = False, per_layer: bool = False
) -> int:
    """Saved bytes of one segment of `own` tokens on `past` tokens of K/V (the backward's peak
    input, whether it was saved at forward or recomputed under activation checkpointing).
    `cuda`: a longer past's lower-right causal runs in the flash kernel, no mask is saved (read
    from torch's `CausalBias` dispatch, not measured here). `per_layer` (checkpointing: layer):
    what the forward keeps (`layer_kept`) plus one layer's recompute (every layer saves alike)."""
    if per_layer:
        one_layer = (segment_bytes(s, b, own, past, cuda) - own * forward_own(s, b)) // s.layers
        return own * layer_kept(s, b) + one_layer
    per_own = s.layers * layer_own(s, b) + forward_own(s, b)
    if past > own:  # K/V repeated; off CUDA the bias is a mask SDPA saves per layer in dtype b
        kv = s.layers * layer_kv(s, b, True) * (own + past)
        return own * per_own + kv + (0 if cuda else s.layers * own * (own + past) * b)
    # padded query: the padded rows, and one more q-sized row per own token (measured); K/V
    # stay grouped but for fp32 on CUDA (its flash kernel is 16-bit only: repeated there)
    padded = s.layers * (past * padded_row(s, b) + own * b * s.q_dim) if past else 0
    repeated = cuda and b > 2 and past > 0
    return own * per_own + s.layers * layer_kv(s, b, repeated) * (own + past) + padded


def layer_kept(s: ModelShape, b: int) -> int:
    """Per own token, what a forward under per-layer checkpointing keeps for its backward: each
    layer's input hidden state and own K/V, one more hidden row (measured: the last layer's
    output, fp32 and bf16 alike), and the per-forward terms outside the layers."""
    return (s.layers + 1) * b * s.hidden + s.layers * 2 * b * s.kv_dim + forward_own(s, b)


def worst_segment(
    s: ModelShape,
    b: int,
    tokens: int,
    cuda: bool = False,
    per_layer: bool = False,
    most_own: int | None = None,
) -> int:
    """The largest `segment_bytes` over every split of `tokens` into past + own (own >= 1).
    `most_own`: own is at most that many tokens (an OPD turn run in segments,
    `learner.opd_segment_tokens`): the rest of the context is past K/V, held in the store."""
    cap = tokens if most_own is None else max(1, min(most_own, tokens))
    best = segment_bytes(s, b, cap, tokens - cap, cuda, per_layer)
    # piecewise linear in own but for the mask's quadratic term: the ends, the switch between
    # the padded and the masked path, and the mask's vertex
    for own in (1, tokens - 1, tokens // 2, (tokens + 1) // 2, tokens // 2 + 1):
        if 1 <= own < cap:
            best = max(best, segment_bytes(s, b, own, tokens - own, cuda, per_layer))
    return best


def leaf_adjoint(s: ModelShape, b: int, past: int) -> int:
    """One layer's past-leaf K and V gradients of an OPD segment: the store's hooks add each into
    the ledger and free it as it arrives (`learner.kvstore`), so one layer's at a time."""
    return 2 * b * s.kv_dim * past


def kept_prompt(s: ModelShape, b: int, checkpointing: str) -> int:
    """Per prompt token of an open GRPO group: its graph stays until the group closes.
    `segment`: only the segment's outputs stay (last hidden row block and its own K/V);
    `layer`: each layer's input and own K/V (`layer_kept`)."""
    if checkpointing == "segment":
        return b * s.hidden + s.layers * 2 * b * s.kv_dim + 16
    if checkpointing == "layer":
        return layer_kept(s, b)
    return s.layers * (layer_own(s, b) + layer_kv(s, b, False)) + forward_own(s, b)


def kv_token(s: ModelShape, b: int) -> int:
    """One token's K/V over every layer in the compute dtype (an OPD store, a prompt's leaves)."""
    return s.layers * 2 * b * s.kv_dim


def formula_note(s: ModelShape, b: int) -> str:
    return (
        f"{s.layers} layers x {layer_own(s, b)} B/token (norms, q, SDPA, MLP"
        + (", q/k norms" if s.qk_norm else "")
        + f") + K/V {layer_kv(s, b, False)} B/token/layer ({layer_kv(s, b, True)} with a mask: "
        f"repeat_kv) + {forward_own(s, b)} B/token per forward"
    )
