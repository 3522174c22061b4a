"""Per-turn and per-trajectory records of the agent loop, and the SkyRL GeneratorOutput converter.

Token layout of a trajectory: `prompt_ids`, then for each turn its action tokens (sampled, loss
mask 1, with their log-probs) followed by its observation tokens (from the environment, mask 0,
log-prob 0.0). `Turn.context_len` is where the turn's action starts in prompt+response, which is
what the teacher needs to score the action under its realised causal context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class TrajectoryRef:
    """One trajectory of a task: `instance_id` and its `repetition` (GRPO: the index in its
    group). `str(ref)` is the run-wide trajectory id `instance#repetition`; nothing parses it back."""

    instance_id: str
    repetition: int = 0

    def __str__(self) -> str:
        return f"{self.instance_id}#{self.repetition}"


@dataclass
class Turn:
    index: int
    context_len: int
    action_ids: list[int]
    action_logprobs: list[float]
    version: int
    finish_reason: str
    action_text: str = ""
    obs_ids: list[int] = field(default_factory=list)
    observation_text: str = ""
    reward: float = 0.0
    malformed: bool = False
    obs_truncated: bool = False
    teacher_logprobs: list[float] | None = None
    gen_start: float = 0.0
    gen_end: float = 0.0
    tool_start: float | None = None
    tool_end: float | None = None
    teacher_start: float | None = None
    teacher_end: float | None = None


@dataclass
class Trajectory:
    trajectory_id: str
    instance_id: str
    repetition: int
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    stop_reason: str = ""  # "done" (env finished: submit), "max_turns", "token_budget"
    malformed_calls: int = 0
    start: float = 0.0
    end: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> TrajectoryRef:
        return TrajectoryRef(self.instance_id, self.repetition)

    @property
    def response_ids(self) -> list[int]:
        return [t for turn in self.turns for t in (*turn.action_ids, *turn.obs_ids)]

    @property
    def loss_mask(self) -> list[int]:
        return [
            m for turn in self.turns for m in [1] * len(turn.action_ids) + [0] * len(turn.obs_ids)
        ]

    @property
    def rollout_logprobs(self) -> list[float]:
        out: list[float] = []
        for turn in self.turns:
            out += turn.action_logprobs + [0.0] * len(turn.obs_ids)
        return out

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + sum(len(t.action_ids) + len(t.obs_ids) for t in self.turns)


def to_generator_output(trajs: list[Trajectory]) -> dict[str, Any]:
    """SkyRL `GeneratorOutput` fields (plain lists, so SkyRL need not be installed)."""
    return {
        "prompt_token_ids": [list(t.prompt_ids) for t in trajs],
        "response_ids": [t.response_ids for t in trajs],
        "rewards": [float(t.reward or 0.0) for t in trajs],
        "loss_masks": [t.loss_mask for t in trajs],
        "stop_reasons": [t.stop_reason for t in trajs],
        "rollout_metrics": {
            "malformed_calls": sum(t.malformed_calls for t in trajs),
            "mean_turns": sum(len(t.turns) for t in trajs) / max(1, len(trajs)),
        },
        "rollout_logprobs": [t.rollout_logprobs for t in trajs],
        "trajectory_ids": [
            {"instance_id": t.instance_id, "repetition_id": t.repetition} for t in trajs
        ],
    }


def _split_turns(
    response: list[int], mask: list[int], logprobs: list[float] | None, context0: int
) -> list[Turn]:
    """Rebuild turns from a loss mask: each maximal run of 1s is an action, the 0s after it its observation."""
    turns: list[Turn] = []
    i, n = 0, len(response)
    lead_obs: list[int] = []
    while i < n and mask[i] == 0:  # observation tokens before any action (rare): keep them
        lead_obs.append(response[i])
        i += 1
    while i < n:
        j = i
        while j < n and mask[j] == 1:
            j += 1
        k = j
        while k < n and mask[k] == 0:
            k += 1
        lps = list(logprobs[i:j]) if logprobs is not None else [0.0] * (j - i)
        turns.append(
            Turn(
                index=len(turns),
                context_len=context0 + i,
                action_ids=list(response[i:j]),
                action_logprobs=lps,
                version=-1,
                finish_reason="",
                obs_ids=list(response[j:k]),
            )
        )
        i = k
    if lead_obs and turns:
        raise ValueError("response starts with masked tokens: put them into prompt_token_ids")
    return turns


def from_generator_output(out: dict[str, Any]) -> list[Trajectory]:
    """Inverse of `to_generator_output` (versions are unknown: -1). Rewards may be per-token lists."""
    n = len(out["prompt_token_ids"])
    lps_all = out.get("rollout_logprobs")
    ids_all = out.get("trajectory_ids") or [None] * n
    stops = out.get("stop_reasons") or [""] * n
    trajs = []
    for i in range(n):
        prompt = list(out["prompt_token_ids"][i])
        resp, mask = list(out["response_ids"][i]), list(out["loss_masks"][i])
        if len(resp) != len(mask):
            raise ValueError(f"trajectory {i}: response_ids and loss_masks differ in length")
        r = out["rewards"][i]
        reward = float(sum(r)) if isinstance(r, list) else float(r)
        tid = ids_all[i]
        if isinstance(tid, dict):
            inst, rep = str(tid["instance_id"]), int(tid["repetition_id"])
        elif tid is not None and hasattr(tid, "instance_id"):
            inst, rep = str(tid.instance_id), int(tid.repetition_id)
        else:
            inst, rep = str(i), 0
        trajs.append(
            Trajectory(
                trajectory_id=str(TrajectoryRef(inst, rep)),
                instance_id=inst,
                repetition=rep,
                prompt_ids=prompt,
                turns=_split_turns(resp, mask, lps_all[i] if lps_all else None, len(prompt)),
                reward=reward,
                stop_reason=stops[i] or "",
            )
        )
    return trajs
