"""SkyRL's inference-engine interface over ThunderSync's in-process HF engine (CPU runs of SkyRL's
own trainer loop, where its HTTP vLLM servers and CUDA weight sync are not available).

Sampling is seeded per request from (run seed, weights version, session, call number within the
session), never from arrival order: two trainers that schedule the same trajectories differently
(SkyRL's batch-synchronous loop, ThunderSync's streaming one) sample the same tokens, which is
what makes their updates comparable end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from skyrl.backends.skyrl_train.inference_servers.base import (
    InferenceEngineInput,
    InferenceEngineInterface,
    InferenceEngineOutput,
)

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.types import SamplingParams

# SkyRL sampling keys an HF engine reproduces; any other key with a non-default value is refused
_DEFAULTS: dict[str, Any] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1}


def _pin(cores: set[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)  # this thread only


def request_seed(base: int, version: int, session: Hashable, call: int) -> int:
    key = f"{base}/{version}/{session}/{call}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def sampling(params: Mapping[str, Any]) -> SamplingParams:
    """SkyRL's vLLM-style sampling dict as the HF engine's parameters."""
    for key, default in _DEFAULTS.items():
        if params.get(key, default) not in (default, None):
            raise ValueError(
                f"generator.sampling_params.{key}={params[key]!r}: the in-process CPU engine "
                f"samples with temperature and top_p only; leave {key} at {default!r}"
            )
    return SamplingParams(
        max_new_tokens=int(params.get("max_tokens") or params.get("max_generate_length") or 16),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
    )


class HFInferenceClient(InferenceEngineInterface):
    """One in-process engine; requests run on worker threads so generation overlaps the learner."""

    def __init__(
        self,
        engine: HFEngine,
        tokenizer: Any,
        name: str,
        seed: int = 0,
        cores: set[int] | None = None,
        concurrency: int = 8,
        zero_staleness: bool = True,
    ) -> None:
        self.engine, self.tokenizer, self.name, self.seed = engine, tokenizer, name, seed
        self.calls: Counter[Hashable] = Counter()
        # zero staleness: a request runs at the version served when it was made, or fails (the
        # version gate); else (SkyRL's fully-async trainer) at whatever is served when it runs
        self.zero_staleness = zero_staleness
        # called with (session, prompt ids, output ids) as each request is served (OPD streaming)
        self.on_turn: Callable[[Hashable, list[int], list[int]], None] | None = None
        # requests run on `concurrency` threads (the others queue), pinned to `cores` when given
        self.pool = ThreadPoolExecutor(concurrency, "tsrl-rollout", _pin, (cores,))

    @property
    def model_name(self) -> str:
        return self.name

    async def generate(
        self, input_batch: InferenceEngineInput, model: str | None = None
    ) -> InferenceEngineOutput:
        prompts = input_batch.get("prompt_token_ids")
        if not prompts:
            raise ValueError("the in-process CPU engine takes token ids (prompt_token_ids)")
        params = sampling(input_batch.get("sampling_params") or {})
        sessions = input_batch.get("session_ids") or [None] * len(prompts)
        version = self.engine.version
        seeds = []
        for s in sessions:
            self.calls[s] += 1
            seeds.append(request_seed(self.seed, version, s, self.calls[s]))
        loop = asyncio.get_running_loop()
        outs = await asyncio.gather(
            *(
                loop.run_in_executor(self.pool, self._one, ids, params, seed, version)
                for ids, seed in zip(prompts, seeds, strict=True)
            )
        )
        ids = [list(o.token_ids) for o in outs]
        if self.on_turn is not None:
            for s, p, out in zip(sessions, prompts, ids, strict=True):
                self.on_turn(s, list(p), list(out))
        return {
            "responses": [self.tokenizer.decode(t, skip_special_tokens=True) for t in ids],
            "response_ids": ids,
            "stop_reasons": [o.finish_reason for o in outs],
            "response_logprobs": [list(o.logprobs) for o in outs],
            "prompt_logprobs": None,
            "rollout_expert_indices": None,
            "rollout_sample_support": None,
        }

    def _one(self, ids: list[int], params: SamplingParams, seed: int, version: int) -> Any:
        return self.engine.generate(
            ids, params, seed, version=version if self.zero_staleness else None
        )

    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_weights(version, weights)

    def get_endpoint_url(self) -> str:
        raise NotImplementedError("the in-process CPU engine has no HTTP endpoint")

    async def chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("the in-process CPU engine serves token-in-token-out only")

    async def render_chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("the in-process CPU engine serves token-in-token-out only")

    async def completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("the in-process CPU engine serves token-in-token-out only")

    async def wake_up(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def update_named_weights(self, request: Any) -> None:
        raise NotImplementedError("weights reach the in-process engine through load_weights")

    async def load_lora_adapter(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("LoRA adapters are merged before the in-process engine loads")

    async def teardown(self) -> None:
        self.pool.shutdown()
        self.engine.close()

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> None:
        return None

    async def pause_generation(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def finish_session(self, session_id: str) -> None:
        return None

    async def get_world_size(self) -> tuple[int, int]:
        return 1, 1
