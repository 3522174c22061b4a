"""Where a checkpoint tensor lives in vLLM's served parameters (for tsrl_vllm_ext.py).

Runs inside vLLM's venv beside tsrl_vllm_ext.py (this folder is on its path) and imports nothing
from this project. A fused parameter (qkv_proj = q, k, v; gate_up_proj = gate, up) stacks its
parts' rows in `packed_modules_mapping` order; a padded vocabulary keeps the checkpoint's rows
first. The shared-memory map (`contiguous_run`) and the delta scatter (`delta_targets`) both
place tensors by these rules.
"""

from __future__ import annotations

from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def sources(name: str, fused: dict[str, list[str]]) -> list[str]:
    """The checkpoint names a served parameter is loaded from (its parts, when fused)."""
    module, _, leaf = name.rpartition(".")
    parent, _, last = module.rpartition(".")
    if last in fused:
        return [f"{parent}.{part}.{leaf}" if parent else f"{part}.{leaf}" for part in fused[last]]
    return [name]


def contiguous_run(
    name: str, p: torch.Tensor, entries: dict[str, dict[str, Any]], fused: dict[str, list[str]]
) -> list[dict[str, Any]] | None:
    """The segment entries whose bytes, back to back, are exactly parameter `p` (None if not)."""
    run = [entries.get(s) for s in sources(name, fused)]
    if any(e is None for e in run) or not p.is_contiguous():
        return None
    es: list[dict[str, Any]] = [e for e in run if e is not None]
    if any(DTYPES[e["dtype"]] != p.dtype for e in es):
        return None
    for a, b in zip(es, es[1:], strict=False):
        if b["offset"] != a["offset"] + a["nbytes"] or a["shape"][1:] != b["shape"][1:]:
            return None
    rows = sum(e["shape"][0] if e["shape"] else 1 for e in es)
    shape = [rows, *es[0]["shape"][1:]] if es[0]["shape"] else []
    if list(p.shape) != shape and not (len(es) == 1 and list(p.shape) == es[0]["shape"]):
        return None
    return es


def delta_targets(
    params: dict[str, torch.Tensor], entries: list[dict[str, Any]], fused: dict[str, list[str]]
) -> dict[str, tuple[str, int]]:
    """checkpoint name -> (served parameter, element offset of its part in it), for every
    tensor of the delta; raises naming the first one that has no such place (a sharded or
    re-laid-out parameter: publish that model in full)."""
    shapes = {e["name"]: e["shape"] for e in entries}
    where: dict[str, tuple[str, int]] = {}
    for pname, p in params.items():
        parts = sources(pname, fused)
        if any(s not in shapes for s in parts):
            continue
        numels = [_numel(shapes[s]) for s in parts]
        trailing = {tuple(shapes[s][1:]) for s in parts}
        whole = sum(numels) == p.numel()
        padded = len(parts) == 1 and p.dim() >= 1 and shapes[parts[0]][1:] == list(p.shape[1:])
        rows_fit = trailing == {tuple(p.shape[1:])}
        if not p.is_contiguous() or not rows_fit or not (whole or padded):
            continue  # no plain place in this parameter: resolved below as missing
        if padded and not whole and p.shape[0] < shapes[parts[0]][0]:
            continue
        offset = 0
        for s, n in zip(parts, numels, strict=True):
            where[s] = (pname, offset)
            offset += n
    tied = {"lm_head.weight"} if "lm_head.weight" not in params else set()
    missing = [e["name"] for e in entries if e["name"] not in where and e["name"] not in tied]
    if missing:
        raise ValueError(
            f"delta tensor {missing[0]!r} has no plain place in a served parameter (sharded or "
            "re-laid-out): publish this model in full (publish.delta: off)"
        )
    return where


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
