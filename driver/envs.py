"""Environments of the shipped training recipes (skyrl-gym `BaseTextEnv`s).

`tsrl-digits` is the learnable toy task of `grpo-toy`: the reward is the share of digit
characters in the agent's reply, so a random tiny model starts near the vocabulary's digit share
and GRPO can raise it within a few updates. With `tool_turns > 0` every turn first runs a real
command in the sandbox (a CPU-light wait of `tool_seconds`, jittered per task for the duration
heterogeneity of real tool calls), which is what the speedup benchmark uses.
"""

from __future__ import annotations

import random
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

DIGITS_ENV = "tsrl-digits"


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.tool_turns = int(extras.get("tool_turns", 0))
        self.tool_seconds = float(extras.get("tool_seconds", 0.0))
        self.jitter = float(extras.get("jitter", 0.5))
        self.rng = random.Random(int(extras.get("seed", 0)))
        self.backend = str(extras.get("sandbox", "local"))
        self.replies: list[str] = []
        self._session: Any = None

    def init(self, prompt: Any = None) -> tuple[Any, dict[str, Any]]:
        self.turns = 0
        self.replies = []
        return (prompt or [{"role": "user", "content": "Reply with numbers only."}]), {}

    def _sandbox(self) -> Any:
        if self._session is None:
            from sandbox.executor import SessionSpec, get_executor

            self._session = get_executor(self.backend).open(SessionSpec(label="digits"))
        return self._session

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.replies.append(action)
        if self.turns <= self.tool_turns:
            secs = self.tool_seconds * (1 + self.jitter * (2 * self.rng.random() - 1))
            res = self._sandbox().exec(f"sleep {max(secs, 0.0):.3f}; echo ok", timeout=30)
            out = res.stdout.strip() if res.exit_code == 0 else f"error {res.exit_code}"
            return BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": f"tool: {out}"}],
                reward=0.0,
                done=False,
                metadata={},
            )
        reward = sum(digit_share(r) for r in self.replies) / len(self.replies)
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def register() -> None:
    import skyrl_gym

    if DIGITS_ENV not in skyrl_gym.registry:
        skyrl_gym.register(id=DIGITS_ENV, entry_point="driver.envs:DigitsEnv")
