"""An independent float64 textbook reference for the learner's update (the project's issue 12).

Nothing here imports project code for the model or the loss: the tiny Llama model is read straight
from its `model.safetensors` + `config.json` and run by a plain-torch forward written out below
(embeddings, RMSNorm, RoPE, grouped-query causal attention, SwiGLU MLP, final norm, untied lm_head),
and the GRPO / OPD losses are the textbook formulas of docs/DESIGN.md over whole sequences, with one
`torch.autograd.grad` on the reference parameters. The only project objects read are the logged
batch's plain data classes (token ids, masks, rewards, teacher log-probs).

Every step runs in the dtype of the parameters it is given (float64 for the exactness checks,
float32 only for the sanity check against the Hugging Face model's own logits).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from thundersync.learner.batch_replay import LoggedBatch
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn


@dataclass(frozen=True)
class RefConfig:
    """The architecture numbers the reference forward needs, read from `config.json`."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float


def perturb_norms(model_dir: Path, seed: int) -> Path:
    """Rewrite the model's 1-d weights (RMSNorm) away from 1: `build_tiny_model` leaves every
    norm weight at exactly 1, which would let a forward that forgets a norm weight pass. Both
    sides of a comparison then read the same rewritten weights file."""
    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    gen = torch.Generator().manual_seed(seed)
    for name, w in sorted(weights.items()):
        if w.dim() == 1:
            weights[name] = (1.0 + 0.2 * torch.randn(w.shape, generator=gen)).to(w.dtype)
    save_file(weights, str(path), metadata={"format": "pt"})
    return model_dir


def read_config(model_dir: Path) -> RefConfig:
    """Read `config.json`; refuse any feature the reference forward does not implement."""
    raw = json.loads((model_dir / "config.json").read_text())
    unsupported = {
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
    }
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or raw.get("rope_scaling"):
        unsupported["rope_scaling"] = True
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"the float64 reference forward does not implement {bad}")
    theta = raw.get("rope_theta", rope.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json gives no rope_theta")
    heads = int(raw["num_attention_heads"])
    return RefConfig(
        hidden=int(raw["hidden_size"]),
        layers=int(raw["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rms_eps=float(raw["rms_norm_eps"]),
        rope_theta=float(theta),
    )


def load_params(model_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights file as leaf tensors of `dtype` that require grad (an exact upcast from fp32)."""
    weights = load_file(str(model_dir / "model.safetensors"))
    return {k: v.to(dtype).clone().requires_grad_(True) for k, v in weights.items()}


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope_tables(
    cfg: RefConfig, length: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin for positions 0..L-1 in `dtype`, Hugging Face's half-split (rotate_half) layout."""
    exponent = torch.arange(0, cfg.head_dim, 2, dtype=dtype) / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta**exponent)
    angles = torch.arange(length, dtype=dtype)[:, None] * inv_freq[None, :]  # [L, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [L, d]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [heads, L, d]: x * cos + (-x2, x1) * sin with x = (x1, x2) split in halves."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _attention(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    pre: str,
    cfg: RefConfig,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    length = x.shape[0]
    q = (x @ p[f"{pre}.q_proj.weight"].T).view(length, cfg.heads, cfg.head_dim).transpose(0, 1)
    k = (x @ p[f"{pre}.k_proj.weight"].T).view(length, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
    v = (x @ p[f"{pre}.v_proj.weight"].T).view(length, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
    cos, sin = rope
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    # grouped-query attention: query head h reads key/value head h // (heads / kv_heads)
    group = cfg.heads // cfg.kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)  # [heads, L, L]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # in the scores' dtype (float64 for the exact checks)
    out = (probs @ v).transpose(0, 1).reshape(length, cfg.heads * cfg.head_dim)
    return out @ p[f"{pre}.o_proj.weight"].T


def _mlp(x: torch.Tensor, p: dict[str, torch.Tensor], pre: str) -> torch.Tensor:
    gate = x @ p[f"{pre}.gate_proj.weight"].T
    up = x @ p[f"{pre}.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ p[f"{pre}.down_proj.weight"].T


def forward_logits(
    params: dict[str, torch.Tensor], cfg: RefConfig, ids: Sequence[int]
) -> torch.Tensor:
    """Logits [L, V] of one whole sequence at positions 0..L-1, in the parameters' dtype."""
    dtype = params["lm_head.weight"].dtype
    h = params["model.embed_tokens.weight"][torch.tensor(list(ids), dtype=torch.long)]
    rope = _rope_tables(cfg, len(ids), dtype)
    for layer in range(cfg.layers):
        pre = f"model.layers.{layer}"
        a = _rms_norm(h, params[f"{pre}.input_layernorm.weight"], cfg.rms_eps)
        h = h + _attention(a, params, f"{pre}.self_attn", cfg, rope)
        m = _rms_norm(h, params[f"{pre}.post_attention_layernorm.weight"], cfg.rms_eps)
        h = h + _mlp(m, params, f"{pre}.mlp")
    h = _rms_norm(h, params["model.norm.weight"], cfg.rms_eps)
    return h @ params["lm_head.weight"].T


def next_token_logprobs(
    params: dict[str, torch.Tensor], cfg: RefConfig, ids: Sequence[int]
) -> torch.Tensor:
    """log pi(x_t | x_<t) for t = 1..L-1 of one whole sequence."""
    logp = torch.log_softmax(forward_logits(params, cfg, ids)[:-1], dim=-1)
    return logp.gather(-1, torch.tensor(list(ids[1:]), dtype=torch.long).view(-1, 1))[:, 0]


def textbook_advantages(estimator: str, rewards: Sequence[float], eps: float) -> list[float]:
    """A_i on the rewards shifted by the group's first reward (equal rewards give exactly 0)."""
    shifted = [r - rewards[0] for r in rewards]
    m = len(shifted)
    mu = math.fsum(shifted) / m
    if estimator == "grpo":
        sigma = math.sqrt(math.fsum((s - mu) ** 2 for s in shifted) / m)  # population sigma
        return [(s - mu) / (sigma + eps) for s in shifted]
    if estimator == "dr_grpo":
        return [s - mu for s in shifted]
    if estimator == "grpo_sample_std":  # SkyRL's grpo: sample sigma; a lone member keeps r
        if m == 1:
            return [rewards[0] / (1.0 + eps)]
        sigma = math.sqrt(math.fsum((s - mu) ** 2 for s in shifted) / (m - 1))
        return [(s - mu) / (sigma + eps) for s in shifted]
    if estimator == "rloo":
        if m < 2:
            raise ValueError("rloo needs groups of at least 2")
        return [m / (m - 1) * (s - mu) for s in shifted]
    raise ValueError(f"unknown estimator {estimator!r}")


def grpo_loss(
    params: dict[str, torch.Tensor],
    cfg: RefConfig,
    batch: LoggedBatch,
    *,
    estimator: str,
    eps: float,
    token_weighting: str,
    group_reduction: str,
) -> torch.Tensor:
    """-(sum or mean over groups of (1/m) sum_i A_i S_i), S_i = sum_scored w log pi(a_t | h_t);
    token_mean: -(sum over groups of sum_i A_i S_i) / (scored tokens of the batch)."""
    items = [it for _, it in batch.events]
    dtype = params["lm_head.weight"].dtype
    objective = torch.zeros((), dtype=dtype)
    tokens = 0
    for g in batch.groups:
        content = {
            it.index: it
            for it in items
            if isinstance(it, GrpoContent) and it.group_id == g.group_id
        }
        reward = {
            it.index: it.reward
            for it in items
            if isinstance(it, GrpoReward) and it.group_id == g.group_id
        }
        adv = textbook_advantages(estimator, [reward[i] for i in range(g.size)], eps)
        for i in range(g.size):
            c = content[i]
            lp = next_token_logprobs(params, cfg, [*g.prompt_ids, *c.response_ids])
            resp_lp = lp[len(g.prompt_ids) - 1 :]  # the predictions of the response tokens
            mask = torch.tensor(c.response_mask, dtype=torch.bool)
            n_scored = int(mask.sum())
            if n_scored == 0:
                continue
            w = 1.0 / n_scored if token_weighting == "seq_mean" else 1.0
            m = 1 if group_reduction == "token_mean" else g.size
            objective = objective + adv[i] * (w * resp_lp[mask].sum()) / m
            tokens += n_scored
    if group_reduction == "token_mean":
        objective = objective / tokens
    elif group_reduction == "mean":
        objective = objective / len(batch.groups)
    elif group_reduction != "sum":
        raise ValueError(f"unknown group_reduction {group_reduction!r}")
    return -objective


def opd_loss(params: dict[str, torch.Tensor], cfg: RefConfig, batch: LoggedBatch) -> torch.Tensor:
    """-(1/N) sum_t stopgrad(log pi_T - log pi) log pi(a_t | h_t) over every scored token."""
    items = [it for _, it in batch.events]
    dtype = params["lm_head.weight"].dtype
    objective = torch.zeros((), dtype=dtype)
    n_scored = 0
    for tid in batch.trajectories:
        turns = sorted(
            (it for it in items if isinstance(it, OpdTurn) and it.traj_id == tid),
            key=lambda t: t.turn,
        )
        ids = [x for t in turns for x in t.token_ids]
        mask = torch.tensor([m for t in turns for m in t.action_mask][1:], dtype=torch.bool)
        teacher = torch.tensor([x for t in turns for x in t.teacher_logprobs], dtype=dtype)
        lp = next_token_logprobs(params, cfg, ids)[mask]
        objective = objective + ((teacher - lp).detach() * lp).sum()
        n_scored += int(mask.sum())
    return -objective / n_scored


def reference_grad(
    model_dir: Path,
    batch: LoggedBatch,
    names: Sequence[str],
    *,
    objective: str,
    estimator: str = "grpo",
    eps: float = 1e-6,
    token_weighting: str = "seq_mean",
    group_reduction: str = "sum",
) -> torch.Tensor:
    """The gradient of the textbook loss in float64, flat in the order of `names`."""
    cfg = read_config(model_dir)
    params = load_params(model_dir, torch.float64)
    if set(names) != set(params):
        raise ValueError(f"the weights file holds {sorted(set(params) ^ set(names))} unmatched")
    if objective == "grpo":
        loss = grpo_loss(
            params,
            cfg,
            batch,
            estimator=estimator,
            eps=eps,
            token_weighting=token_weighting,
            group_reduction=group_reduction,
        )
    else:
        loss = opd_loss(params, cfg, batch)
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    flat = [
        torch.zeros(params[n].numel(), dtype=torch.float64) if g is None else g.reshape(-1)
        for n, g in zip(names, grads, strict=True)
    ]
    return torch.cat(flat)
