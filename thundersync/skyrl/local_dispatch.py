"""SkyRL's `WorkerDispatch` for one in-process policy worker (CPU runs of SkyRL's trainer loop).

SkyRL's dispatch fans each call out to a Ray actor group per model and syncs weights over NCCL or
CUDA IPC. Here there is one policy worker in the trainer's process and an in-process engine, so
each call is a direct call and the weight sync is a copy into the engine, versioned like
ThunderSync's publish. Only the policy trains; a reference model (the teacher of SkyRL's
distillation recipe) is served for forwards; a critic is refused (`trainers.check_cpu_loop`).
"""

from __future__ import annotations

import time
from typing import Any

from thundersync.skyrl.hf_client import HFInferenceClient


class LocalDispatch:
    """The calls SkyRL's trainers make on `self.dispatch`, served by one local policy worker."""

    def __init__(self, worker: Any, client: HFInferenceClient, ref: Any = None) -> None:
        self.worker, self.client, self.ref = worker, client, ref
        self.version = client.engine.version
        self.last_sync_s = 0.0

    def _policy(self, model: str) -> Any:
        if model == "ref" and self.ref is not None:
            return self.ref  # forward only: the teacher of SkyRL's distillation recipe
        if model != "policy":
            raise ValueError(f"model {model!r}: this CPU dispatch serves the policy (and ref)")
        return self.worker

    # data plane
    def stage_data(self, model: str, data: Any, boundaries: list[tuple[int, int]]) -> list[Any]:
        self._policy(model)
        return [[data[s:e]] for s, e in boundaries]

    def forward(self, model: str, data: Any, **_: Any) -> Any:
        return self._policy(model).forward(data)

    def forward_from_staged(self, model: str, chunk_refs: list[Any], **_: Any) -> Any:
        return self._policy(model).forward(chunk_refs[0])

    def forward_backward(self, model: str, data: Any, **_: Any) -> Any:
        return self._policy(model).forward_backward(data)

    def forward_backward_from_staged(self, model: str, chunk_refs: list[Any], **_: Any) -> Any:
        return self._policy(model).forward_backward(chunk_refs[0])

    def optim_step(self, model: str, model_id: str | None = None) -> float:
        return float(self._policy(model).optim_step())

    # weight sync: the worker's weights copied into the engine under the next version (SkyRL
    # also syncs once before the first step: version 1 is the start weights)
    def init_weight_sync_state(self, inference_engine_client: Any) -> None:
        if inference_engine_client is not self.client:
            raise ValueError("the CPU dispatch syncs weights into its own in-process engine only")

    async def save_weights_for_sampler(self, model_id: str | None = None) -> None:
        t0 = time.perf_counter()
        self.version += 1
        self.client.load_weights(self.version, self.worker.weights())
        self.last_sync_s = time.perf_counter() - t0

    def get_timing_metrics(self) -> dict[str, float]:
        return {"sync_weights_only_transfer": self.last_sync_s}

    # bookkeeping SkyRL's loop calls; nothing to do for one in-process CPU worker
    def get_lcm_dp_size(self) -> int:
        return 1

    def empty_cache(self, model: str | None = None) -> None:
        return None

    def finalize_pending_saves(self, model: str) -> None:
        return None

    def mark_all_offloaded(self) -> None:
        return None

    def get_node_ids(self) -> list[str]:
        return []

    def save_checkpoint(self, model: str, ckpt_dir: str, **_: Any) -> None:
        raise NotImplementedError(
            "trainer.ckpt_interval: the CPU dispatch does not write SkyRL checkpoints; set it to 0"
        )

    def load_checkpoint(self, model: str, ckpt_dir: str, **_: Any) -> None:
        raise NotImplementedError(
            "trainer.resume_mode: the CPU dispatch does not read SkyRL checkpoints; set it to none"
        )

    def save_hf_model(self, model: str, export_dir: str, tokenizer: Any) -> None:
        raise NotImplementedError(
            "trainer.hf_save_interval: the CPU dispatch does not export HF models; set it to 0"
        )
