"""Harbor / TB2 task.toml loading (`terminal.load_task` dispatches here): limits, network,
the reward key, multi-step tasks.

Multi-step (`[[steps]]`, Harbor's layout): each step has `name` (its folder steps/<name>/ holds
instruction.md, optional tests/ copied over the task's tests/, optional solution/solve.sh),
optional `min_reward` (a lower step reward ends the episode; later steps earn 0) and
`[steps.agent]` / `[steps.verifier]` timeout_sec (default the task's). The task-level
`multi_step_reward_strategy` is "mean" (Harbor's default) or "final". Refused with the field
named: `skills_dir` (agent skills are not given to the policy), step fields this loader does not
know and steps/<name>/environment/ (per-step environment files).
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from pathlib import Path
from typing import Any

from thundersync.sandbox.envs.terminal_task import (
    NEEDS_NET,
    Layout,
    Step,
    TaskError,
    TerminalTask,
    _need,
    _number,
    _weights,
)
from thundersync.sandbox.executor import Limits

_STEP_KEYS = {"name", "min_reward", "agent", "verifier"}
_UNITS = {"": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


def _memory_mb(src: Path, env: dict[str, Any]) -> int:
    """[environment] memory_mb (an integer) or memory ("2G", "512M", "1.5Gi", "1024MB")."""
    if "memory_mb" in env and "memory" in env:
        raise TaskError(f"{src}: [environment] has both memory_mb and memory; keep one")
    if "memory" in env:
        value = env["memory"]
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b?)\s*", str(value), re.I)
        if isinstance(value, bool) or not isinstance(value, str) or not m:
            raise TaskError(
                f'{src}: [environment] memory must be a size string like "2G" or "512M", '
                f"got {value!r} (or give memory_mb as an integer)"
            )
        mem = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        field_name = "memory"
    else:
        mem, field_name = env.get("memory_mb", 1024), "memory_mb"
    if isinstance(mem, bool) or not isinstance(mem, int) or mem < 64:
        raise TaskError(f"{src}: [environment] {field_name} must be at least 64 MB, got {mem!r}")
    return mem


NETWORK_MODES = {"no-network": False, "public": True, "allowlist": False}


def _network_mode(src: Path, table: dict[str, Any], section: str) -> bool | None:
    """[section] network_mode / allowed_hosts as network on or off; None when neither is set."""
    mode, hosts = table.get("network_mode"), table.get("allowed_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise TaskError(f"{src}: [{section}] allowed_hosts must be a list of host names")
    if mode is None and not hosts:
        return None
    if mode is None:  # Harbor: allowed_hosts alone means network_mode = "allowlist"
        mode = "allowlist"
    if not isinstance(mode, str) or mode not in NETWORK_MODES:
        raise TaskError(
            f"{src}: [{section}] network_mode must be one of {sorted(NETWORK_MODES)}, got {mode!r}"
        )
    if hosts and mode != "allowlist":
        raise TaskError(
            f'{src}: [{section}] allowed_hosts is only valid with network_mode = "allowlist" '
            f"(got {mode!r}); remove allowed_hosts"
        )
    if hosts:
        raise TaskError(
            f"{src}: [{section}] allowed_hosts = {hosts!r}: this sandbox cannot limit egress to "
            'hosts (network is on or off); use network_mode = "public" or "no-network"'
        )
    return NETWORK_MODES[mode]


def _network(src: Path, tables: dict[str, dict[str, Any]]) -> tuple[bool, bool]:
    """(agent's network, verifier's network) from [environment] and the phase overrides."""
    env = tables["environment"]
    allow = env.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise TaskError(f"{src}: [environment] allow_internet must be true or false, got {allow!r}")
    mode = _network_mode(src, env, "environment")
    if allow is not None and mode is not None and allow != mode:
        raise TaskError(
            f"{src}: [environment] allow_internet = {str(allow).lower()} and network_mode = "
            f"{env.get('network_mode', 'allowlist')!r} disagree; keep network_mode (allow_internet "
            "is Harbor's older spelling)"
        )
    base = mode if mode is not None else bool(allow)
    agent = _network_mode(src, tables["agent"], "agent")
    verifier = _network_mode(src, tables["verifier"], "verifier")
    return (base if agent is None else agent), (base if verifier is None else verifier)


def _network_note(src: Path, env: dict[str, Any], verifier_on: bool, scripts: list[Path]) -> str:
    """Where the project's default (no network) differs from Harbor's (network on) for a
    verifier that looks like it downloads."""
    if verifier_on or "network_mode" in env or "allow_internet" in env:
        return ""
    needs = [p.name for p in scripts if p.is_file() and NEEDS_NET.search(p.read_text())]
    if not needs:
        return ""
    return (
        f"{src}: network unset, so off (the project's default; Harbor's is on) while "
        f'{needs[0]} installs or downloads: give [verifier] network_mode = "public" if it must'
    )


def _steps(
    p: Path, src: Path, meta: dict[str, Any], agent_t: float, test_t: float
) -> tuple[tuple[Step, ...], str]:
    raw = meta["steps"]
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise TaskError(f"{src}: [[steps]] must be a non-empty array of tables")
    steps, seen = [], set()
    for i, s in enumerate(raw):
        where = f"{src}: [[steps]] #{i + 1}"
        name = s.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise TaskError(f"{where}: 'name' must be a folder name under steps/, got {name!r}")
        if name in seen:
            raise TaskError(f"{where}: step name {name!r} is used twice")
        seen.add(name)
        unknown = sorted(set(s) - _STEP_KEYS)
        if unknown:
            raise TaskError(
                f"{where} ({name}): field {unknown[0]!r} is not supported here (known: "
                f"{sorted(_STEP_KEYS)}); remove it"
            )
        d = p / "steps" / name
        if (d / "environment").exists():
            raise TaskError(
                f"{d / 'environment'}: per-step environment files are not supported; move them "
                "into environment/ (built once for every step)"
            )
        instr = _need(d / "instruction.md", f"step {name!r}'s instruction").read_text().strip()
        if not instr:
            raise TaskError(f"{d / 'instruction.md'}: empty")
        tables = {}
        for k in ("agent", "verifier"):
            t = s.get(k, {})
            if not isinstance(t, dict):
                raise TaskError(f"{where} ({name}): [steps.{k}] must be a table")
            tables[k] = t
        mr = s.get("min_reward")
        if mr is not None and (isinstance(mr, bool) or not isinstance(mr, int | float)):
            raise TaskError(f"{where} ({name}): min_reward must be a number, got {mr!r}")
        tests = d / "tests" if (d / "tests").is_dir() else None
        if not (tests and (tests / "test.sh").is_file()) and not (p / "tests/test.sh").is_file():
            raise TaskError(f"{d / 'tests/test.sh'}: missing, and no task-level tests/test.sh")
        sol = d / "solution/solve.sh"
        steps.append(
            Step(
                name=name,
                instruction=instr,
                agent_timeout=_number(src, tables["agent"], "timeout_sec", agent_t),
                test_timeout=_number(src, tables["verifier"], "timeout_sec", test_t),
                tests=tests,
                solution=sol if sol.is_file() else None,
                min_reward=None if mr is None else float(mr),
            )
        )
    strategy = meta.get("multi_step_reward_strategy", "mean")
    if strategy not in ("mean", "final"):
        raise TaskError(
            f'{src}: multi_step_reward_strategy must be "mean" or "final", got {strategy!r}'
        )
    return tuple(steps), strategy


def load_harbor(p: Path) -> TerminalTask:
    src = p / "task.toml"
    try:
        meta = tomllib.loads(src.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{src}: not valid TOML ({e})") from None
    tables = {}
    for name in ("agent", "verifier", "environment"):
        t = meta.get(name, {})
        if not isinstance(t, dict):
            raise TaskError(f"{src}: [{name}] must be a table")
        tables[name] = t
    env = tables["environment"]
    network, verifier_network = _network(src, tables)
    if "skills_dir" in env or "skills_dir" in meta:
        raise TaskError(
            f"{src}: skills_dir: agent skills are not supported (the policy gets no skill files; "
            "a task that depends on them would train on a different task); remove it"
        )
    agent_t = _number(src, tables["agent"], "timeout_sec", 600)
    test_t = _number(src, tables["verifier"], "timeout_sec", 120)
    steps: tuple[Step, ...] = ()
    strategy = "mean"
    if "steps" in meta:
        steps, strategy = _steps(p, src, meta, agent_t, test_t)
        instr = steps[0].instruction  # instruction.md is never the agent's in a multi-step task
    else:
        instr = _need(p / "instruction.md", "the task instruction").read_text().strip()
        if not instr:
            raise TaskError(f"{p / 'instruction.md'}: empty; write the task for the agent there")
        _need(p / "tests" / "test.sh", "the Harbor verifier")
    key = tables["verifier"].get("reward_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise TaskError(f"{src}: [verifier] reward_key must be a reward.json key, got {key!r}")
    mem = _memory_mb(src, env)
    cpus = env.get("cpus", 1)
    if isinstance(cpus, str):
        with contextlib.suppress(ValueError):
            cpus = float(cpus)
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus < 1e4:
        raise TaskError(f"{src}: [environment] cpus must be a positive number, got {cpus!r}")
    disk = env.get("storage_mb", Limits().disk_mb)  # the session's disk quota (sandbox.quota)
    if isinstance(disk, bool) or not isinstance(disk, int) or disk <= 0:
        raise TaskError(f"{src}: [environment] storage_mb must be a positive integer, got {disk!r}")
    scripts = [p / "tests/test.sh", *(s.tests / "test.sh" for s in steps if s.tests)]
    return TerminalTask(
        path=p,
        layout=Layout.HARBOR,
        instruction=instr,
        agent_timeout=agent_t,
        test_timeout=test_t,
        verifier=p / "tests" / "test.sh",
        solution=p / "solution/solve.sh" if (p / "solution/solve.sh").is_file() else None,
        weights=_weights(p / "weights.json"),
        limits=Limits(memory_mb=mem, cpus=float(cpus), disk_mb=disk),
        network=network,
        verifier_network=verifier_network,
        reward_key=key,
        network_note=_network_note(src, env, verifier_network, scripts),
        steps=steps,
        step_reward=strategy,
    )
