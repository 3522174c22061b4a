"""Gold / no-op checks of tasks: the oracle must earn reward 1 and doing nothing must earn 0.

Both go through the real environments (tool calls, submit, verifier in the sandbox), so a
check failing means the task, the verifier or the sandbox is broken - not the agent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sandbox.envs import fixtures
from sandbox.envs.swesmith import SweInstance, load_instances
from sandbox.envs.swesmith_env import SWESmithEnv
from sandbox.envs.terminal import load_task
from sandbox.envs.terminal_env import TerminalEnv
from sandbox.executor import Executor


def check_swe(
    inst: SweInstance, executor: Executor, repos_dir: Path | None = None
) -> dict[str, Any]:
    t0 = time.monotonic()
    extras: dict[str, Any] = {"instance": inst.instance_id, "executor": executor}
    extras["instances_path"] = inst.source.rsplit(":", 1)[0].split("[")[0]
    if repos_dir is not None:
        extras["repos_dir"] = str(repos_dir)
    env = SWESmithEnv(extras=extras)
    try:
        env.init()
        body = json.dumps({"path": ".tsrl_gold.patch", "content": inst.patch})
        env.step(f"<tool>create\n{body}</tool>")
        env.step("<tool>bash\ngit apply -R .tsrl_gold.patch && rm .tsrl_gold.patch</tool>")
        gold = env.step("<tool>submit</tool>")
        env.init()
        noop = env.step("<tool>submit</tool>")
    finally:
        env.close()
    return {
        "task": inst.instance_id,
        "kind": "swesmith",
        "gold_reward": gold["reward"],
        "noop_reward": noop["reward"],
        "gold_reason": gold["metadata"]["grade"]["reason"],
        "noop_reason": noop["metadata"]["grade"]["reason"],
        "seconds": round(time.monotonic() - t0, 2),
    }


def check_terminal(path: Path, executor: Executor) -> dict[str, Any]:
    t0 = time.monotonic()
    task = load_task(path)
    env = TerminalEnv(extras={"task": task, "executor": executor})
    try:
        env.init()
        assert env.session is not None
        sol = env.session.exec(task.solution.read_text(), timeout=task.agent_timeout)
        gold = env.step("<tool>submit</tool>")
        env.init()
        noop = env.step("<tool>submit</tool>")
    finally:
        env.close()
    return {
        "task": task.name,
        "kind": task.layout.value,
        "gold_reward": gold["reward"],
        "noop_reward": noop["reward"],
        "gold_reason": gold["metadata"]["verdict"]["reason"]
        + ("" if sol.ok else f" (solution exit {sol.exit_code})"),
        "noop_reason": noop["metadata"]["verdict"]["reason"],
        "seconds": round(time.monotonic() - t0, 2),
    }


def check_path(
    path: Path, executor: Executor, repos_dir: Path | None = None
) -> list[dict[str, Any]]:
    """A task directory (TB1/SETA/Harbor) or a .json/.jsonl file of SWE-smith records."""
    if path.is_file():
        return [check_swe(i, executor, repos_dir) for i in load_instances(path)]
    return [check_terminal(path, executor)]


def check_all(executor: Executor) -> list[dict[str, Any]]:
    out = check_path(fixtures.SWESMITH_INSTANCES, executor)
    for task in fixtures.terminal_tasks():
        out += check_path(task, executor)
    return out


def summarize(details: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tasks": len(details),
        "gold_ok": sum(1 for d in details if d["gold_reward"] == 1.0),
        "noop_ok": sum(1 for d in details if d["noop_reward"] == 0.0),
        "details": details,
    }
