"""Gold / no-op checks of tasks: the oracle must earn reward 1 and doing nothing must earn 0.

Both go through the real environments (tool calls, submit, verifier in the sandbox), so a
check failing means the task, the verifier or the sandbox is broken - not the agent.
On the local backend (which builds no Dockerfile) a terminal task whose Dockerfile adds to the
image (`sandbox.images.local_gap`) is not run: it is listed in the summary's "skipped" with the
reason (check it with --backend docker) and counted in neither "tasks" nor "details";
`tsrl env check` then exits 1 for a task path (with --all: the fixtures span both backends).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from thundersync.config import BUILTIN_TASK_SETS
from thundersync.sandbox.envs import fixtures
from thundersync.sandbox.envs.base import ToolEnv
from thundersync.sandbox.envs.swesmith import RecordError, SweInstance, load_instances
from thundersync.sandbox.envs.swesmith_env import SWESmithEnv
from thundersync.sandbox.envs.taskset_check import record_problem
from thundersync.sandbox.envs.terminal import load_task
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.executor import Backend, Executor
from thundersync.sandbox.images import local_gap


def _gold_and_noop(
    env: ToolEnv, gold: Callable[[ToolEnv], str], task: str, kind: str, key: str, t0: float
) -> dict[str, Any]:
    """Episode 1: `gold(env)` does the oracle's work (and returns a note for the reason), then
    submit; episode 2: submit at once. Both rewards, and the reasons in metadata[key]."""
    try:
        env.init()
        note = gold(env)
        done = _submit(env)
        env.init()
        noop = _submit(env)
    finally:
        env.close()
    return {
        "task": task,
        "kind": kind,
        "gold_reward": done["reward"],
        "noop_reward": noop["reward"],
        "gold_reason": done["metadata"][key]["reason"] + note,
        "noop_reason": noop["metadata"][key]["reason"],
        "seconds": round(time.monotonic() - t0, 2),
    }


def _submit(env: ToolEnv) -> Any:
    """Submit until the episode ends (a multi-step terminal task asks once per step)."""
    out = env.step("<tool>submit</tool>")
    while not out["done"]:
        out = env.step("<tool>submit</tool>")
    return out


def check_swe(
    inst: SweInstance, executor: Executor, repos_dir: Path | None = None
) -> dict[str, Any]:
    t0 = time.monotonic()
    extras: dict[str, Any] = {"instance": inst.instance_id, "executor": executor}
    extras["instances_path"] = inst.source.rsplit(":", 1)[0].split("[")[0]
    if repos_dir is not None:
        extras["repos_dir"] = str(repos_dir)

    def gold(env: ToolEnv) -> str:
        body = json.dumps({"path": ".tsrl_gold.patch", "content": inst.patch})
        env.step(f"<tool>create\n{body}</tool>")
        out = env.step(
            "<tool>bash\ngit apply -R .tsrl_gold.patch 2>&1; rc=$?; rm .tsrl_gold.patch; exit $rc</tool>"
        )
        obs = out["observations"][0]["content"] if out["observations"] else ""
        return (
            "" if "[exit code 0]" in obs else f" (gold patch does not apply: {obs.strip()[-300:]})"
        )

    env = SWESmithEnv(extras=extras)
    return _gold_and_noop(env, gold, inst.instance_id, "swesmith", "grade", t0)


def check_terminal(path: Path, executor: Executor) -> dict[str, Any]:
    t0 = time.monotonic()
    task = load_task(path)
    gap = local_gap(task.dockerfile) if Backend(executor.backend) is Backend.LOCAL else None
    if gap:
        why = f"cannot run on the local backend (needs docker): {gap}"
        return {"task": task.name, "kind": task.layout.value, "skipped": why}
    solution = task.solution

    def gold(env: ToolEnv) -> str:
        assert env.session is not None and solution is not None
        sol = env.session.exec(solution.read_text(), timeout=task.agent_timeout)
        return "" if sol.ok else f" (solution exit {sol.exit_code})"

    def gold_steps(env: ToolEnv) -> str:  # each step's solve.sh, then submit (not the last)
        notes = ""
        for i, st in enumerate(task.steps):
            assert env.session is not None and st.solution is not None
            sol = env.session.exec(st.solution.read_text(), timeout=st.agent_timeout)
            notes += "" if sol.ok else f" (step {st.name} solution exit {sol.exit_code})"
            if i < len(task.steps) - 1:
                env.step("<tool>submit</tool>")
        return notes

    env = TerminalEnv(extras={"task": task, "executor": executor})
    if task.steps and all(st.solution for st in task.steps):
        return _gold_and_noop(env, gold_steps, task.name, task.layout.value, "verdict", t0)
    if solution is None:  # Harbor without solution/: loads for training, no gold to check
        out = _gold_and_noop(env, lambda e: "", task.name, task.layout.value, "verdict", t0)
        out["gold_reward"] = None
        out["gold_reason"] = "no solution/ in the task (training only): gold not checked"
        return out
    return _gold_and_noop(env, gold, task.name, task.layout.value, "verdict", t0)


def check_path(
    path: Path, executor: Executor, repos_dir: Path | None = None
) -> list[dict[str, Any]]:
    """A task directory (TB1/SETA/Harbor), a folder of them (a terminal task set, as
    `env.tasks` names one), or a .json/.jsonl file of SWE-smith records."""
    if path.is_file():
        insts = load_instances(path)
        for inst in insts:  # refused before any episode runs
            if bad := record_problem(inst):
                raise RecordError(bad)
        return [check_swe(i, executor, repos_dir) for i in insts]
    is_task = any((path / f).is_file() for f in ("task.yaml", "task.toml"))
    subs = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() and not is_task else []
    if subs and all(any((d / f).is_file() for f in ("task.yaml", "task.toml")) for d in subs):
        return [check_terminal(d, executor) for d in subs]
    return [check_terminal(path, executor)]


def check_all(executor: Executor, workers: int = 3) -> list[dict[str, Any]]:
    """Every shipped fixture, `workers` tasks at a time (each task's episodes wait on its
    sandbox most of the time); results in fixture order."""
    jobs: list[Callable[[], dict[str, Any]]] = [
        functools.partial(check_swe, inst, executor)
        for inst in load_instances(fixtures.SWESMITH_INSTANCES)
    ]
    terminal = fixtures.terminal_tasks()
    for name in BUILTIN_TASK_SETS:  # the built-in sets (terminal-easy) are shipped fixtures too
        terminal += fixtures.terminal_tasks(fixtures.builtin_task_dir(name))
    jobs += [functools.partial(check_terminal, t, executor) for t in terminal]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda job: job(), jobs))


def summarize(details: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [d for d in details if "skipped" not in d]
    return {
        "tasks": len(ran),
        "gold_ok": sum(1 for d in ran if d["gold_reward"] == 1.0),
        "noop_ok": sum(1 for d in ran if d["noop_reward"] == 0.0),
        "gold_unchecked": sum(1 for d in ran if d["gold_reward"] is None),
        "details": ran,
        "skipped": [{"task": d["task"], "reason": d["skipped"]} for d in details if d not in ran],
    }
