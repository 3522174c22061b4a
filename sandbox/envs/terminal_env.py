"""`TerminalEnv`: a skyrl-gym BaseTextEnv for Terminal-Bench style tasks (TB1 / SETA / Harbor).

extras: `task` (a task directory), `backend` ("local" | "docker"), `max_turns` (30),
`tool_timeout` (60 s). The prompt is the task instruction plus the tool list; the agent acts in
/app with the tools of `sandbox.envs.tools`; on `submit` (or max_turns) the verifier runs in the
same session and its reward in [0, 1] ends the episode (metadata["verdict"] says why).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from sandbox.envs.terminal import TaskError, TerminalTask, Verdict, load_task, verify
from sandbox.envs.tools import TOOL_HELP, Tool, ToolCallError, parse_action, run_tool
from sandbox.executor import Executor, Session, get_executor


class TerminalEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        if "task" not in extras:
            raise TaskError("extras['task'] must be a TB1/SETA or Harbor task directory")
        self.task: TerminalTask = (
            extras["task"]
            if isinstance(extras["task"], TerminalTask)
            else load_task(extras["task"])
        )
        self.max_turns = int(extras.get("max_turns", 30))
        self.tool_timeout = float(extras.get("tool_timeout", 60))
        self.executor: Executor = extras.get("executor") or get_executor(
            extras.get("backend", "local")
        )
        self.session: Session | None = None
        self.verdict: Verdict | None = None

    def prompt(self) -> ConversationType:
        return [
            {
                "role": "system",
                "content": "You work in a Linux terminal; the task directory is /app.\n"
                + TOOL_HELP,
            },
            {"role": "user", "content": self.task.instruction},
        ]

    def init(
        self, prompt: ConversationType | None = None
    ) -> tuple[ConversationType, dict[str, Any]]:
        self.close()
        self.session = self.executor.open(self.task.session_spec())
        self.turns = 0
        self.verdict = None
        return (prompt or self.prompt()), {"task": self.task.name, "layout": self.task.layout.value}

    def _finish(self, note: str) -> BaseTextEnvStepOutput:
        assert self.session is not None
        self.verdict = verify(self.session, self.task)
        meta = {"verdict": asdict(self.verdict), "task": self.task.name, "end": note}
        return BaseTextEnvStepOutput(
            observations=[], reward=self.verdict.reward, done=True, metadata=meta
        )

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.session is None:
            raise RuntimeError("call init() before step()")
        self.turns += 1
        try:
            call = parse_action(action)
            if call.tool is Tool.SUBMIT:
                return self._finish("submit")
            obs = run_tool(self.session, call, self.tool_timeout)
        except ToolCallError as e:
            obs = f"error: {e}"
        if self.turns >= self.max_turns:
            return self._finish("max_turns")
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": obs}], reward=0.0, done=False, metadata={}
        )

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
