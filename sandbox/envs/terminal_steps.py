"""Helpers of `TerminalEnv`: a task image's own /app, and the reward of a multi-step task.

`image_app`: on the docker backend /app starts as the task's Dockerfile built it (the TB1 /
Harbor harnesses run the agent in that image): the image's /app is unpacked once per image id
into the artefact cache and becomes the session's task dir (a session's /app is its own quota
filesystem, so the image's files are copied in, never the task folder's app/ unless the
Dockerfile copied it).

`multi_step_verdict`: Harbor's `multi_step_reward_strategy`: "mean" (the mean of the step
rewards; a step never reached - the episode ended at max_turns or below a step's min_reward -
counts 0, so stopping early never pays) or "final" (the last verified step's). Named scores are
kept per step as "<step>/<name>".
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from thundersync.cache import cache_root
from thundersync.sandbox.envs.fixtures import _built_once
from thundersync.sandbox.envs.terminal import TerminalTask
from thundersync.sandbox.envs.terminal_verify import Verdict


def image_app(client: Any, image: str) -> Path | None:
    """The image's /app unpacked on the host (None when the image has no /app or it is empty)."""
    import docker.errors

    key = str(client.images.get(image).id).split(":")[-1][:16]

    def build(tmp: Path) -> None:
        c = client.containers.create(image, ["true"], user="0:0", network_mode="none")
        try:
            stream, _ = c.get_archive("/app")
            data = b"".join(stream)
        except docker.errors.NotFound:
            data = b""
        finally:
            c.remove(force=True)
        (tmp / "app").mkdir()
        if data:  # members under app/; the "data" filter refuses links out, devices, set-id
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                t.extractall(tmp, filter="data")

    root = _built_once(cache_root() / f"task-image-app-{key}", build) / "app"
    return root if root.is_dir() and any(root.iterdir()) else None


def multi_step_verdict(task: TerminalTask, verdicts: list[Verdict]) -> Verdict:
    steps = task.steps
    rewards = [v.reward for v in verdicts] + [0.0] * (len(steps) - len(verdicts))
    if task.step_reward == "final":
        reward = verdicts[-1].reward if verdicts else 0.0
    else:
        reward = sum(rewards) / len(steps)
    scores: dict[str, float] = {}
    parts = []
    for st, v in zip(steps, verdicts, strict=False):
        scores[f"{st.name}/reward"] = v.reward
        scores.update({f"{st.name}/{k}": x for k, x in v.scores.items() if k != "reward"})
        parts.append(f"{st.name}: {v.reward:g} ({v.reason[:200]})")
    missed = [st.name for st in steps[len(verdicts) :]]
    if missed:
        parts.append(f"not reached: {missed}")
    return Verdict(reward, f"{task.step_reward} of steps: " + "; ".join(parts), scores=scores)
