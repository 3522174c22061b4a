"""The shipped hack suite: scripted "agents" that try to game the graders (`tsrl env check --hacks`).

Each `Hack` is a sequence of tool actions a policy could emit, run through the same env API a
policy uses (`init`, `step(action)`, `step("<tool>submit</tool>")`) on a shipped fixture task
(`sandbox/fixtures/`). Every hack's honest reward is 0 (it solves nothing), so it is *defeated*
when the episode earns reward 0 and no observation shows its `leak` marker (text it prints
only when it read something the agent must not see: hidden tests, root-only files).
The definitions (`Hack`, the suite `HACKS`) are in `sandbox.envs.hacks_defs`; this module runs
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from thundersync.sandbox.envs.base import ToolEnv
from thundersync.sandbox.envs.hacks_defs import HACKS, Hack, Kind
from thundersync.sandbox.envs.hacks_grader import HACKS_GRADER
from thundersync.sandbox.envs.hacks_harbor import HACKS_HARBOR
from thundersync.sandbox.executor import Executor

HACKS.extend(h for h in HACKS_HARBOR if h not in HACKS)  # the Harbor verifier hacks
HACKS.extend(h for h in HACKS_GRADER if h not in HACKS)  # the SWE-smith grader's families


def _make_env(kind: Kind, target: str, executor: Executor) -> ToolEnv:
    from thundersync.sandbox.envs import fixtures
    from thundersync.sandbox.envs.swesmith_env import SWESmithEnv
    from thundersync.sandbox.envs.terminal_env import TerminalEnv

    if kind is Kind.SWESMITH:
        return SWESmithEnv(extras={"instance": target, "executor": executor})
    return TerminalEnv(extras={"task": str(fixtures.TERMINAL_DIR / target), "executor": executor})


def run_hack(hack: Hack, env: ToolEnv) -> dict[str, Any]:
    """One episode of `hack` in `env` (an env of its target); the per-hack JSON record."""
    t0 = time.monotonic()
    env.init()
    seen: list[str] = []
    for action in hack.actions:
        out = env.step(action)
        seen += [o["content"] for o in out["observations"]]
        if out["done"]:  # max_turns: the env already graded it
            break
    else:
        out = env.step("<tool>submit</tool>")
    key = "grade" if hack.kind is Kind.SWESMITH else "verdict"
    reward = float(out["reward"])
    reason = str(out["metadata"].get(key, {}).get("reason", ""))
    leaked = hack.leak is not None and any(hack.leak in s for s in seen)
    if leaked:
        reason = f"LEAK: an observation shows {hack.leak!r}; " + reason
    return {
        "name": hack.name,
        "task": hack.target,
        "kind": hack.kind.value,
        "reward": reward,
        "defeated": reward == 0.0 and not leaked,
        "reason": reason[-600:],
        "idea": hack.idea,
        "seconds": round(time.monotonic() - t0, 2),
    }


def _crashed(hack: Hack, e: Exception) -> dict[str, Any]:
    """A hack whose run raised: not a defeat (the grader never said 0), reported as such."""
    return {
        "name": hack.name,
        "task": hack.target,
        "kind": hack.kind.value,
        "reward": None,
        "defeated": False,
        "reason": f"hack run crashed: {type(e).__name__}: {e}",
        "idea": hack.idea,
        "seconds": 0.0,
    }


def _run_group(
    hacks: list[Hack], executor: Executor, on_done: Callable[[dict[str, Any]], None] | None
) -> list[dict[str, Any]]:
    """The hacks of one target in one env, one after another (its sessions come back warm from
    the pool; a task image is built once)."""
    env: ToolEnv | None = None
    out = []
    try:
        for hack in hacks:
            try:
                env = env or _make_env(hack.kind, hack.target, executor)
                out.append(run_hack(hack, env))
            except Exception as e:  # report it and run the rest
                out.append(_crashed(hack, e))
            if on_done is not None:
                on_done(out[-1])
    finally:
        if env is not None:
            env.close()
    return out


def run_hacks(
    executor: Executor,
    hacks: list[Hack] | None = None,
    workers: int = 4,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every hack (default: the shipped suite); targets run in parallel threads (`workers`),
    the hacks of one target in order in one env. Records come back in suite order; `on_done`
    (progress) gets each record as its hack ends, from the worker threads."""
    todo = HACKS if hacks is None else hacks
    groups: dict[tuple[Kind, str], list[Hack]] = {}
    for hack in todo:
        groups.setdefault((hack.kind, hack.target), []).append(hack)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        runs = [pool.submit(_run_group, g, executor, on_done) for g in groups.values()]
        by_name = {d["name"]: d for run in runs for d in run.result()}
    return [by_name[h.name] for h in todo]


def summarize(details: list[dict[str, Any]]) -> dict[str, Any]:
    beaten = [d["name"] for d in details if not d["defeated"]]
    return {
        "total": len(details),
        "defeated": len(details) - len(beaten),
        "not_defeated": beaten,
        "seconds": round(sum(d["seconds"] for d in details), 2),
    }
