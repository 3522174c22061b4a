"""`DigitsEnv` (`tsrl-digits`): the learnable toy task of `grpo-toy` / `opd-toy` (`env.name: toy`).

The reward is the share of digit characters in the agent's replies, so a random tiny model starts
near the vocabulary's digit share and GRPO can raise it within a few updates. With
`tool_turns > 0` every turn first runs a real command in the sandbox (a CPU-light wait of
`tool_seconds`, jittered per task for the duration heterogeneity of real tool calls), which is
what the speedup benchmark uses; that session is leased from the pool of `extras["backend"]`
on the first tool turn and kept until `close()` (see `sandbox.envs.base`).
extras: tool_turns (0), tool_seconds (0.0), jitter (0.5), seed (0), backend, pool_size.
"""

from __future__ import annotations

import random
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput, ConversationType

from thundersync.sandbox.envs.base import SessionEnv
from thundersync.sandbox.executor import Session, SessionSpec

PROMPT = [{"role": "user", "content": "Reply with numbers only."}]


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv(SessionEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        extras = extras or {}
        super().__init__(extras)
        self.tool_turns = int(extras.get("tool_turns", 0))
        self.tool_seconds = float(extras.get("tool_seconds", 0.0))
        self.jitter = float(extras.get("jitter", 0.5))
        self.rng = random.Random(int(extras.get("seed", 0)))
        self.replies: list[str] = []

    def init(
        self, prompt: ConversationType | None = None
    ) -> tuple[ConversationType, dict[str, Any]]:
        self.turns = 0
        self.replies = []
        return (prompt or list(PROMPT)), {}

    def _sandbox(self) -> Session:
        if self.session is None:
            return self.acquire_session(SessionSpec(label="digits"))
        return self.session

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.replies.append(action)
        if self.turns <= self.tool_turns:
            secs = self.tool_seconds * (1 + self.jitter * (2 * self.rng.random() - 1))
            res = self._sandbox().exec(f"sleep {max(secs, 0.0):.3f}; echo ok", timeout=30)
            out = res.stdout.strip() if res.exit_code == 0 else f"error {res.exit_code}"
            return self.observe(f"tool: {out}")
        return self.done(sum(digit_share(r) for r in self.replies) / len(self.replies), {})
