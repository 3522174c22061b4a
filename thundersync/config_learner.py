"""The learner side's config sections: the model, the optimiser and the learner (with their
enums). Re-exported by `thundersync.config`, where callers look."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from thundersync.config_base import _Section


class Estimator(StrEnum):
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    # SkyRL's `grpo`: the sample std (m - 1), and a lone member keeps its raw reward
    GRPO_SAMPLE_STD = "grpo_sample_std"


class Device(StrEnum):
    AUTO = "auto"  # cuda when torch sees a GPU, else cpu
    CPU = "cpu"
    CUDA = "cuda"


class AccumDevice(StrEnum):
    HOST = "host"  # fp32/fp64 accumulators in host memory (pinned when the learner is on CUDA)
    DEVICE = "device"  # on the learner's device (faster, costs accelerator memory)


class OpdTurnGraphs(StrEnum):
    """OPD: how a turn's graph reaches the close-time propagation of its K/V adjoint."""

    AUTO = "auto"  # recompute on CUDA (memory-bound), keep on CPU (compute-bound)
    RECOMPUTE = "recompute"  # free it after the turn, re-forward it at close: memory linear in J
    KEEP = "keep"  # keep it until close: one forward per turn, memory grows with the past


class Checkpointing(StrEnum):
    """`learner.activation_checkpointing`: what a segment keeps for its backward."""

    NONE = "none"  # every activation (fastest)
    # only the segment's inputs and outputs: least kept between sources (an open group's prompt),
    # but the backward recomputes the whole segment at once (its peak does not drop)
    SEGMENT = "segment"
    # each decoder layer's input and own K/V: the backward recomputes one layer at a time (long
    # context: the peak is the boundaries plus one layer)
    LAYER = "layer"

    @classmethod
    def of(cls, value: Checkpointing | bool | str) -> Checkpointing:
        """A mode from its name, or from a bool (recipes before `layer`: true = segment)."""
        if isinstance(value, bool):
            return cls.SEGMENT if value else cls.NONE
        return cls(value)


class GroupReduction(StrEnum):
    SUM = "sum"  # the paper: g_k = sum over groups of the group directions g_G
    MEAN = "mean"  # g_k divided by the number of groups of the update
    # SkyRL's default `token_mean`: sum_i A_i sum_t grad log pi over every group, divided by the
    # update's scored tokens (needs token_weighting: token_sum)
    TOKEN_MEAN = "token_mean"


class GrpoSum(StrEnum):
    """How a GRPO group's sums G1 / G2 are accumulated (`learner.grpo_sum`)."""

    # `accum_dtype`, in arrival order, shift c = the group's first bound reward unless
    # `learner.reward_shift` fixes it: another arrival order changes the roundings
    ARRIVAL = "arrival"
    # float64 whatever `accum_dtype`, shift fixed before the run: order-free once narrowed
    FLOAT64 = "float64"


class Arch(StrEnum):
    """The family of the tiny model (`model.tiny_arch`, `tsrl model tiny --arch`)."""

    LLAMA = "llama"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"


class ModelConfig(_Section):
    path: str | None = Field(
        None, description="HF model directory, or built in: 'smollm2'; None builds the tiny model"
    )
    tiny_arch: Arch = Field(Arch.LLAMA, description="tiny model family: llama | qwen2 | qwen3")
    tiny_seed: int = 0
    tiny_hidden: int | None = Field(
        None, ge=32, description="tiny model width; None: 64, or 128 with rollout.engine=vllm"
    )
    tiny_layers: int = Field(2, ge=1)
    dtype: str = "float32"
    lora_rank: int = Field(0, ge=0, description="0 trains all weights; >0 trains LoRA adapters")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scale alpha (updates scale alpha/r)")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="module names LoRA adapts, or ['all-linear']: every linear layer but the "
        "output head (the paper's r=32, alpha=64 setting)",
    )

    @field_validator("lora_targets")
    @classmethod
    def _lora_targets(cls, v: list[str]) -> list[str]:
        if not v or any(not t.strip() for t in v):
            raise ValueError(
                "list module names (e.g. [q_proj, v_proj]) or [all-linear]; an empty name or "
                "list adapts nothing"
            )
        if "all-linear" in v and len(v) > 1:
            raise ValueError("all-linear already covers every linear layer: give it alone")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in ("float32", "float64", "bfloat16"):
            raise ValueError(f"unknown dtype {v!r}: use one of float32, float64, bfloat16")
        return v


class OptimConfig(_Section):
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(
        1.0, gt=0, description="global-norm clip; use a large value to disable"
    )


class LearnerConfig(_Section):
    estimator: Estimator = Estimator.GRPO
    std_eps: float = Field(1e-6, gt=0)
    token_weighting: str = "seq_mean"
    max_open_groups: int = Field(4, ge=1, description="admission cap per rank on groups with stats")
    accum_dtype: str = "float32"
    grpo_sum: GrpoSum = Field(
        GrpoSum.ARRIVAL,
        description="GRPO group sums G1/G2: arrival (accum_dtype, arrival order: another order "
        "changes their roundings) | float64 (arrival-order independent, 16 bytes per parameter "
        "per open group; learner.engine_grpo.grpo_sum_dtype)",
    )
    reward_shift: float | None = Field(
        None,
        description="GRPO: the shift c of r_i - c, fixed before any reward (set it near the "
        "rewards when they sit far from 0); None: each group's first bound reward with grpo_sum "
        "arrival, 0 with grpo_sum float64",
    )
    ranks: int = Field(1, ge=1)
    device: Device = Field(Device.AUTO, description="where the learner computes")
    accum_device: AccumDevice = Field(AccumDevice.HOST, description="where accumulators live")
    optimizer_device: AccumDevice = Field(
        AccumDevice.DEVICE,
        description="where the fp32 master weights / shards and AdamW state live and the step "
        "runs: device (the learner's GPU) or host (as the paper keeps Adam; the GPU then holds "
        "only the compute replica)",
    )
    deterministic: bool = Field(
        False, description="torch.use_deterministic_algorithms (+ CUBLAS_WORKSPACE_CONFIG on CUDA)"
    )
    group_reduction: GroupReduction = Field(
        GroupReduction.SUM,
        description="GRPO: sum (the paper) or mean of the group directions, or token_mean "
        "(SkyRL's default: every scored token weighs the same; needs token_weighting token_sum)",
    )
    max_held_bytes: int | None = Field(
        None, ge=1, description="admission by bytes held (accumulators, held grads, K/V stores)"
    )
    host_threads: int = Field(
        1,
        ge=1,
        description="threads for the host accumulators' adds, bit for bit the one-thread sum "
        "(learner/host_adds.py; matmuls keep one thread)",
    )
    reduce_bucket_mb: float = Field(
        256.0,
        gt=0,
        description="ranks > 1: the fp64 update sum crosses to the GPU and is all-reduced in "
        "buckets of this many MB (GPU memory for the reduction: one bucket, not the whole sum)",
    )
    activation_checkpointing: Checkpointing = Field(
        Checkpointing.NONE,
        description="none | segment | layer: recompute a segment's activations in its backward, "
        "the segment at once or one decoder layer at a time (true / false: segment / none)",
    )
    opd_turn_graphs: OpdTurnGraphs = Field(
        OpdTurnGraphs.AUTO, description="OPD: recompute | keep each turn's graph until close"
    )
    opd_segment_tokens: int | None = Field(
        None,
        description="OPD: run a turn as segments of at most this many tokens, each on the K/V "
        "of everything before it (activations scale with it, not with the turn); None: one "
        "segment per turn. The gradient is the same either way",
    )
    logprob_chunk: int = Field(
        1024, ge=1, description="rows of the LM head computed at once (scored positions only)"
    )

    @model_validator(mode="after")
    def _token_mean(self) -> LearnerConfig:
        if (
            self.group_reduction is GroupReduction.TOKEN_MEAN
            and self.token_weighting != "token_sum"
        ):
            raise ValueError(
                "learner.group_reduction=token_mean divides by the update's scored tokens, so "
                "each trajectory's tokens count as tokens: set learner.token_weighting=token_sum"
            )
        return self

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_bool(cls, v: object) -> object:
        return (
            Checkpointing.of(v) if isinstance(v, bool) else v
        )  # an unknown name: the enum's error

    @field_validator("opd_segment_tokens")
    @classmethod
    def _segment_tokens(cls, v: int | None) -> int | None:
        if v is None or v >= 1:
            return v
        raise ValueError(
            f"learner.opd_segment_tokens must be a positive number of tokens (or null: one "
            f"segment per turn), got {v!r}"
        )

    @field_validator("token_weighting")
    @classmethod
    def _tw(cls, v: str) -> str:
        if v not in ("seq_mean", "token_sum"):
            raise ValueError(f"unknown token_weighting {v!r}: use 'seq_mean' or 'token_sum'")
        return v

    @field_validator("accum_dtype")
    @classmethod
    def _acc(cls, v: str) -> str:
        if v not in ("float32", "float64"):
            raise ValueError(f"unknown accum_dtype {v!r}: use 'float32' or 'float64'")
        return v
