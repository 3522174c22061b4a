"""`ToyCalcEnv` (`tsrl-toy-calc`): arithmetic with a calculator tool, no sandbox needed.

It exists so the agent loop, `tsrl eval` and the tests run without a sandbox. Tool-call format
(the same shape the sandbox envs use): one `<tool>NAME ARGS</tool>` block per action.
  <tool>calc 2*(3+4)</tool>   -> observation with the value (digits and + - * / ( ) only)
  <tool>submit 14</tool>      -> done; reward 1.0 if the answer equals `extras["answer"]`
Anything else is a malformed call: an error observation, `metadata["malformed_tool_call"] = True`.
At `max_turns` (extras, default 4) the last observation ends the episode with reward 0. It uses
the step outputs of `sandbox.envs.base.SessionEnv` (and never leases a session).
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput

from thundersync.sandbox.envs.base import SessionEnv

_CALL = re.compile(r"<tool>\s*(\w+)\s*(.*?)\s*</tool>", re.S)
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def safe_eval(expr: str) -> float:
    """Evaluate + - * / and parentheses on numbers; raises ValueError on anything else."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](ev(node.left), ev(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](ev(node.operand)))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ZeroDivisionError) as e:
        raise ValueError(str(e)) from None


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.6g}"


class ToyCalcEnv(SessionEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        extras = extras or {}
        super().__init__(extras)
        self.answer = str(extras.get("answer", ""))
        self.max_turns = int(extras.get("max_turns", 4))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        m = _CALL.search(action)
        out_of_turns = self.turns >= self.max_turns
        if m is None:
            return self.observe(
                "error: no tool call; use <tool>calc EXPR</tool> or <tool>submit ANSWER</tool>",
                done=out_of_turns,
                malformed=True,
            )
        name, arg = m.group(1), m.group(2)
        if name == "submit":
            ok = arg.strip() == self.answer
            return self.done(1.0 if ok else 0.0, {"correct": ok})
        if name == "calc":
            try:
                return self.observe(_fmt(safe_eval(arg)), done=out_of_turns)
            except ValueError as e:
                return self.observe(f"error: {e}", done=out_of_turns)
        return self.observe(f"error: unknown tool {name!r}", done=out_of_turns, malformed=True)
