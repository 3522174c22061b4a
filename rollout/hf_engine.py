"""In-process Hugging Face inference engine: the embedded default and the fast-test backend.

Generation is a plain sampling loop over the KV cache with a seeded `torch.Generator`, so the same
(prompt, params, seed, weights) always gives the same tokens, and the returned log-probs are exactly
the policy's raw log-probs that the learner recomputes. Weight loads are in place, behind the
version gate (in-flight requests drain first).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from thundersync.rollout.checkpoint import load_state_dict
from thundersync.rollout.gate import VersionGate
from thundersync.rollout.types import Generation, LoadAck, SamplingParams
from thundersync.rollout.weight_wire import (
    ShmWeights,
    WeightWireError,
    is_shm_uri,
    iter_delta,
    iter_shm,
    read_index,
)


def sample_token(
    logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
) -> tuple[int, float]:
    """Pick the next token from 1-D logits; returns (token, raw log-prob at temperature 1)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    if params.temperature == 0:
        tok = int(torch.argmax(logits))
    else:
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p
            probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_p[keep])
        tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(logp[tok])


class HFEngine:
    """Inference engine backed by a transformers causal LM living in this process."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        version: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        from thundersync.hf_models import load_model

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        model: Any = load_model(model_dir, dtype=dtype)
        self.model = model.to(self.device)
        eos = self.model.config.eos_token_id
        self.eos_token_ids: set[int] = set(
            eos if isinstance(eos, list) else [eos] if eos is not None else []
        )
        self._gate = VersionGate(version)

    @property
    def version(self) -> int:
        return self._gate.version

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        *,
        version: int | None = None,
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: an engine needs at least one prompt token")
        with self._gate.request(version) as served:
            gen = torch.Generator().manual_seed(seed)
            stops = set(params.stop_token_ids) | self.eos_token_ids
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
            past: Any = None
            toks: list[int] = []
            lps: list[float] = []
            finish = "length"
            for _ in range(params.max_new_tokens):
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                # sampled on the host with a host generator: the same tokens on every device
                tok, lp = sample_token(out.logits[0, -1].float().cpu(), params, gen)
                toks.append(tok)
                lps.append(lp)
                if tok in stops:
                    finish = "stop"
                    break
                ids = torch.tensor([[tok]], dtype=torch.long, device=self.device)
            return Generation(toks, lps, served, finish)

    def load_weights(
        self, version: int, source: str | Path | Mapping[str, torch.Tensor]
    ) -> LoadAck:
        t0 = time.monotonic()
        if is_shm_uri(source):
            seg = ShmWeights.parse(str(source))
            index = read_index(seg)
            if index.get("kind") == "delta":
                if index["version"] != version:
                    raise WeightWireError(
                        f"{seg.path} holds version {index['version']}, not {version}"
                    )
                if self.version == index["base"]:
                    return self._apply_delta(version, seg, index, t0)
                if not index.get("full"):
                    raise WeightWireError(
                        f"the delta of v{version} applies to v{index['base']}, this engine holds "
                        f"v{self.version} and no full version was published: publish it in full "
                        "(publish.delta: off)"
                    )
                source = str(index["full"])  # not at the base: the full version
        if is_shm_uri(source):  # views of the shared segment; load_state_dict copies them
            state: Mapping[str, torch.Tensor] = dict(
                iter_shm(ShmWeights.parse(str(source)), version)
            )
        elif isinstance(source, str | Path):
            state = load_state_dict(source)
        else:
            state = source
        with self._gate.loading(version), torch.no_grad():
            missing, unexpected = self.model.load_state_dict(dict(state), strict=False)
            if unexpected or [m for m in missing if m != "lm_head.weight"]:
                raise ValueError(
                    f"weights do not fit the model: missing={missing[:5]} unexpected="
                    f"{unexpected[:5]} (publish the full state dict of the same architecture)"
                )
        return LoadAck(version, "in_place", time.monotonic() - t0)

    def _apply_delta(
        self, version: int, seg: ShmWeights, index: dict[str, Any], t0: float
    ) -> LoadAck:
        """Scatter the changed elements into the parameters (bitwise: values in their own
        dtype, cast only if the engine runs another dtype, exactly as a full load casts).
        Checked before anything is written: every name and shape fits the model."""
        sd = self.model.state_dict()
        for e in index["tensors"]:
            t = sd.get(e["name"])
            if t is None or list(t.shape) != e["shape"]:
                raise ValueError(
                    f"delta tensor {e['name']!r} {e['shape']} does not fit the model "
                    "(publish the full state dict of the same architecture)"
                )
        changed = 0
        with self._gate.loading(version), torch.no_grad():
            for name, idx, vals in iter_delta(seg, index):
                flat = sd[name].view(-1)
                flat[idx.to(flat.device)] = vals.to(device=flat.device, dtype=flat.dtype)
                changed += idx.numel()
        return LoadAck(version, "delta", time.monotonic() - t0, {"changed": str(changed)})

    def close(self) -> None:
        pass
