"""`TerminalEnv`: a skyrl-gym env (a `ToolEnv`) for Terminal-Bench style tasks (TB1 / SETA / Harbor).

extras: `task` (a task directory or a loaded `TerminalTask`), `examples` (worked examples, the
run's `env.examples`), and those of `sandbox.envs.base` (`backend`, `max_turns` 30,
`tool_timeout` 60 s). The prompt is the tool list (system), each example as a user turn and the
assistant's reply, then the task instruction; the agent acts in /app with the tools of
`sandbox.envs.tools`; on `submit` (or max_turns) the agent's /app is packed, its session given
back (no process of it survives), and the verifier runs in a fresh session of the task's
`verify_spec()` with the task's own tests (`sandbox.envs.terminal_verify`); its reward in [0, 1]
ends the episode (metadata["verdict"] says why). Sessions come from the pool, so envs of one
task reuse each other's (reset between).
Image: on the docker backend both sessions run in the task's image built from its Dockerfile
(`sandbox.images.ensure_image`, once per build context; init metadata["image"]); on the local
backend nothing is built and metadata["image_note"] says so (and why the task may need docker).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput, ConversationType

from thundersync.sandbox.envs.base import ToolEnv
from thundersync.sandbox.envs.terminal import Step, TaskError, TerminalTask, load_task
from thundersync.sandbox.envs.terminal_steps import image_app, multi_step_verdict
from thundersync.sandbox.envs.terminal_verify import Verdict, snapshot_app, verify
from thundersync.sandbox.envs.tools import TOOL_HELP
from thundersync.sandbox.executor import Backend, Session
from thundersync.sandbox.images import ensure_image, local_gap

LOCAL_VERIFIER_DIRS = ("/data", "/output")


def _examples(raw: Any) -> list[tuple[str, str]]:
    """extras["examples"] (the run's `env.examples`): [{"user": str, "assistant": str}, ...]."""
    ok = isinstance(raw, list) and all(
        isinstance(e, dict)
        and all(isinstance(e.get(k), str) and e[k] for k in ("user", "assistant"))
        for e in raw
    )
    if not ok:
        raise TaskError(
            "extras['examples'] must be a list of {'user': text, 'assistant': text} (env.examples)"
        )
    return [(e["user"], e["assistant"]) for e in raw]


class TerminalEnv(ToolEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        extras = dict(extras or {})
        super().__init__(extras)
        if "task" not in extras:
            raise TaskError("extras['task'] must be a TB1/SETA or Harbor task directory")
        self.task: TerminalTask = (
            extras["task"]
            if isinstance(extras["task"], TerminalTask)
            else load_task(extras["task"])
        )
        self.examples = _examples(extras.get("examples") or [])
        self.verdict: Verdict | None = None
        self._image: str | None = None  # the built task image (docker backend), once known
        self._image_app: Path | None = None  # the image's own /app, unpacked on the host
        self.reward_key: str | None = extras.get("reward_key")  # the recipe's reward.json key
        self.step_index = 0  # multi-step: the step the agent works on
        self.step_verdicts: list[Verdict] = []

    def image(self) -> str | None:
        """The task's image on the docker backend (built on first use), else None."""
        executor = self.pool.executor
        if self._image is None and self.pool.backend is Backend.DOCKER and self.task.dockerfile:
            client = executor.client  # type: ignore[attr-defined]
            context = self.task.build_context
            self._image = ensure_image(client, self.task.name, context, self.task.dockerfile)
            self._image_app = image_app(client, self._image)
        return self._image

    def image_note(self) -> str:
        if self.pool.backend is Backend.DOCKER:
            return f"image {self._image}" if self._image else "no Dockerfile: the sandbox base"
        if self.task.dockerfile is None:
            return "no Dockerfile: the sandbox base"
        gap = local_gap(self.task.dockerfile)
        note = "local backend: Dockerfile not built (the sandbox base runs the task)"
        return f"{note}; {gap}" if gap else note

    def prompt(self) -> ConversationType:
        system = "You work in a Linux terminal; the task directory is /app.\n" + TOOL_HELP
        shots: ConversationType = []
        for user, assistant in self.examples:  # a small model follows a format it saw used
            shots += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": assistant},
            ]
        return [
            {"role": "system", "content": system},
            *shots,
            {"role": "user", "content": self.task.instruction},
        ]

    def agent_user(self) -> str | None:
        """The task image's USER (docker backend) for the agent's commands; None (the sandbox
        user, uid 65534) when the image declares none or root: agents never run as root."""
        image = self.image()
        if image is None:
            return None
        client = self.pool.executor.client  # type: ignore[attr-defined]
        user = str((client.images.get(image).attrs.get("Config") or {}).get("User") or "")
        return None if user.split(":")[0] in ("", "root", "0") else user

    def open_session(self) -> Session:
        spec = self.task.session_spec(self.image())
        if self._image is not None:  # /app as the Dockerfile built it (its app/ only if copied)
            spec = replace(spec, workdir=self._image_app)
        user = self.agent_user()
        return self.acquire_session(replace(spec, exec_user=user) if user else spec)

    def start(self) -> dict[str, Any]:
        self.verdict = None
        self.step_index, self.step_verdicts = 0, []
        meta = {"task": self.task.name, "layout": self.task.layout.value}
        return meta | {"image": self._image, "image_note": self.image_note()}

    def _verify(self, step: Step | None, keep_session: bool) -> Verdict:
        """Pack the agent's /app and verify it in a fresh session. The last (or only) step
        gives the agent's session back first; a multi-step task's earlier steps keep it (the
        trajectory goes on) and verify in a session opened outside the pool (an env holding
        two pooled leases could wait on itself)."""
        assert self.session is not None
        app = snapshot_app(self.session)
        if not keep_session:
            self.release_session()  # every agent process gone; an env never holds two leases
        if app is None:
            return Verdict(0.0, "could not pack the agent's /app for the verifier")
        spec = self.task.verify_spec(self._image)
        if self.pool.backend is Backend.LOCAL:
            # no root and a read-only / here: the directories TB1 / Harbor verifiers write
            # outside /app (what a root verifier would create) are writable scratch instead
            spec = replace(spec, scratch=(*spec.scratch, *LOCAL_VERIFIER_DIRS))
        if keep_session:
            s = self.pool.executor.open(spec)
            try:
                return verify(s, self.task, app, self.reward_key, step)
            finally:
                s.close()
        with self.pool.acquire(spec) as s:
            return verify(s, self.task, app, self.reward_key, step)

    def _finish(self, note: str) -> BaseTextEnvStepOutput:
        steps = self.task.steps
        if not steps or note != "submit" or self.step_index >= len(steps) - 1:
            return super()._finish(note)
        step = steps[self.step_index]
        v = self._verify(step, keep_session=True)
        self.step_verdicts.append(v)
        if step.min_reward is not None and v.reward < step.min_reward:
            return super()._finish("min_reward")  # Harbor's early stop; later steps earn 0
        self.step_index += 1
        nxt = steps[self.step_index]
        return self.observe(f"Step {self.step_index + 1} of {len(steps)}:\n{nxt.instruction}")

    def finish(self, note: str) -> tuple[float, dict[str, Any]]:
        steps = self.task.steps
        if not steps:
            self.verdict = self._verify(None, keep_session=False)
            meta = {"verdict": asdict(self.verdict), "task": self.task.name}
            return self.verdict.reward, meta | {"scores": dict(self.verdict.scores)}
        if note != "min_reward":
            self.step_verdicts.append(self._verify(steps[self.step_index], keep_session=False))
        else:
            self.release_session()
        self.verdict = multi_step_verdict(self.task, self.step_verdicts)
        meta = {"verdict": asdict(self.verdict), "task": self.task.name}
        return self.verdict.reward, meta | {"scores": dict(self.verdict.scores)}
