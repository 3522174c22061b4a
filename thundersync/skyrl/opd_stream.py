"""OPD turns from inside SkyRL's agent loop: each generated turn, scored by the teacher as soon as
the engine returns it (while the environment runs the tool call), becomes an `OpdTurn` source; the
trajectory's end (SkyRL's agent loop returned) closes it.

The engine sees every call of a trajectory (SkyRL's session id) with its whole token context:
token-in-token-out, so the context of call k is the context of call k - 1, its output and the
observation tokens. A turn's segment is what the context gained since the last turn plus the
output; only output tokens are scored (the segment's first token never is, as in the learner's
turn contract). At the close the trajectory SkyRL trains on (prompt + response, its loss mask) is
checked against the segments: a mismatch would make the update differ from SkyRL's, so it fails
the update instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from thundersync.learner.sources import OpdClose, OpdTurn
from thundersync.teacher.scorer import HFScorer, ScoreRequest


class TrajectoryMismatch(RuntimeError):
    """SkyRL's trajectory differs from the turns its engine served."""


@dataclass
class _Open:
    tokens: list[int] = field(default_factory=list)  # every token the turns covered
    mask: list[int] = field(default_factory=list)
    turns: int = 0


class OpdTurns:
    """Per trajectory: the tokens covered so far; turns and closes as learner sources."""

    def __init__(self, teacher: HFScorer) -> None:
        self.teacher = teacher
        self.open: dict[str, _Open] = {}

    def turn(self, traj: str, context: Sequence[int], output: Sequence[int]) -> list[OpdTurn]:
        """The source of one served call (`context` its prompt tokens, `output` the reply); the
        first call of `traj` opens it (the caller registers it with the engine)."""
        t = self.open.setdefault(traj, _Open())
        if list(context[: len(t.tokens)]) != t.tokens:
            raise TrajectoryMismatch(f"{traj}: turn {t.turns}'s context does not extend the last")
        new = list(context[len(t.tokens) :])
        segment = new + list(output)
        mask = [0] * len(new) + [1] * len(output)
        if not segment:
            return []
        mask[0] = 0  # predicted across the cut: never scored
        scores = (
            self.teacher.score_batch([ScoreRequest([*context, *output], len(context), key=None)])[0]
            if output
            else []
        )
        scored = [s for s, m in zip(scores, mask[len(new) :], strict=True) if m]
        source = OpdTurn(
            f"{traj}/t{t.turns}",
            traj,
            t.turns,
            tuple(segment),
            tuple(mask),
            tuple(scored),
            start=len(t.tokens),
        )
        t.tokens += segment
        t.mask += mask
        t.turns += 1
        return [source]

    def close(self, traj: str, trajectory: Any) -> OpdClose:
        """The close of `traj` once SkyRL's agent loop returned `trajectory` (TrajectoryOutput)."""
        t = self.open.pop(traj, None)
        if t is None:
            raise TrajectoryMismatch(f"{traj}: closed without a served turn")
        prompt = list(trajectory.prompt_ids)
        tokens = prompt + list(trajectory.response_ids)
        mask = [0] * len(prompt) + [int(m) for m in trajectory.loss_mask]
        # SkyRL scores the first response token; the turn contract never scores a segment's
        # first token, which for turn 0 is a prompt token: the masks agree on the response
        if tokens != t.tokens or mask[1:] != t.mask[1:]:
            raise TrajectoryMismatch(
                f"{traj}: SkyRL's trajectory ({len(tokens)} tokens) is not the {t.turns} turns "
                f"its engine served ({len(t.tokens)} tokens): the update would differ from SkyRL's"
            )
        return OpdClose(f"{traj}/close", traj, t.turns)
