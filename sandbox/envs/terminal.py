"""Terminal-Bench task directories: TB1 / SETA (task.yaml) and Harbor / TB2 (task.toml).

TB1 / SETA: task.yaml (instruction, max_agent_timeout_sec, max_test_timeout_sec), Dockerfile,
run-tests.sh, solution.sh, tests/test_outputs.py, optional weights.json {test_name: weight}
(SETA partial reward = passed weight / total weight; without it the reward is 1 only when every
test passes). Harbor / TB2: task.toml ([agent] timeout_sec, [verifier] timeout_sec,
[environment] cpus, memory_mb, allow_internet), instruction.md, environment/, solution/solve.sh,
tests/test.sh; the reward is read from /logs/verifier/reward.json (its "reward" key, else the
mean of its numbers) or reward.txt (a float).
The agent works in /app, seeded from `app/` (TB1) or `environment/app/` (Harbor) when present.
Dockerfiles are *not* built: tasks run on the sandbox base (python3, pytest, git); the docker
backend uses the task image only when `image` is given. Tests are copied into /tests only at
verification time, so the agent never sees them.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from sandbox.envs.swesmith import Status, parse_pytest_log
from sandbox.executor import Limits, Session, SessionSpec

APP = "/app"
SCRATCH = ("/tests", "/logs")


class Layout(StrEnum):
    TB1 = "tb1"
    HARBOR = "harbor"


class TaskError(ValueError):
    """A malformed task directory; the message names the file, the field and the expectation."""


@dataclass(frozen=True)
class TerminalTask:
    path: Path
    layout: Layout
    instruction: str
    agent_timeout: float
    test_timeout: float
    verifier: Path  # run-tests.sh (TB1) or tests/test.sh (Harbor)
    solution: Path
    weights: dict[str, float] | None = None
    limits: Limits = field(default_factory=Limits)
    network: bool = False

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def app_seed(self) -> Path | None:
        seed = self.path / ("app" if self.layout is Layout.TB1 else "environment/app")
        return seed if seed.is_dir() else None

    def session_spec(self) -> SessionSpec:
        return SessionSpec(
            workdir=self.app_seed,
            mount_at=APP,
            network=self.network,
            limits=self.limits,
            scratch=SCRATCH,
            label=f"term-{self.name}",
        )


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise TaskError(f"{path}: missing ({what})")
    return path


def _number(src: Path, table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskError(f"{src}: field {key!r} must be a positive number of seconds, got {value!r}")
    return float(value)


def _weights(path: Path) -> dict[str, float] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not data:
        raise TaskError(f"{path}: expected a non-empty object {{test_name: weight}}")
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise TaskError(f"{path}: weight of {k!r} must be a number >= 0, got {v!r}")
    if sum(data.values()) <= 0:
        raise TaskError(f"{path}: weights sum to 0; at least one must be positive")
    return {str(k): float(v) for k, v in data.items()}


def load_task(path: str | Path) -> TerminalTask:
    p = Path(path)
    if (p / "task.yaml").is_file():
        return _load_tb1(p)
    if (p / "task.toml").is_file():
        return _load_harbor(p)
    raise TaskError(
        f"{p}: not a task directory (expected task.yaml for TB1/SETA or task.toml for Harbor)"
    )


def _load_tb1(p: Path) -> TerminalTask:
    src = p / "task.yaml"
    try:
        meta = yaml.safe_load(src.read_text())
    except yaml.YAMLError as e:
        raise TaskError(f"{src}: not valid YAML ({e})") from None
    if not isinstance(meta, dict):
        raise TaskError(f"{src}: expected a mapping with an 'instruction' field")
    instruction = meta.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{src}: field 'instruction' must be a non-empty string")
    return TerminalTask(
        path=p,
        layout=Layout.TB1,
        instruction=instruction.strip(),
        agent_timeout=_number(src, meta, "max_agent_timeout_sec", 600),
        test_timeout=_number(src, meta, "max_test_timeout_sec", 120),
        verifier=_need(p / "run-tests.sh", "the TB1 test runner"),
        solution=_need(p / "solution.sh", "the oracle solution"),
        weights=_weights(p / "weights.json"),
    )


def _load_harbor(p: Path) -> TerminalTask:
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
    instr = _need(p / "instruction.md", "the task instruction").read_text().strip()
    if not instr:
        raise TaskError(f"{p / 'instruction.md'}: empty; write the task for the agent there")
    mem = env.get("memory_mb", 1024)
    cpus = env.get("cpus", 1)
    if not isinstance(mem, int) or mem < 64:
        raise TaskError(f"{src}: [environment] memory_mb must be an integer >= 64, got {mem!r}")
    if not isinstance(cpus, int | float) or cpus <= 0:
        raise TaskError(f"{src}: [environment] cpus must be a positive number, got {cpus!r}")
    return TerminalTask(
        path=p,
        layout=Layout.HARBOR,
        instruction=instr,
        agent_timeout=_number(src, tables["agent"], "timeout_sec", 600),
        test_timeout=_number(src, tables["verifier"], "timeout_sec", 120),
        verifier=_need(p / "tests" / "test.sh", "the Harbor verifier"),
        solution=_need(p / "solution" / "solve.sh", "the oracle solution"),
        limits=Limits(memory_mb=mem, cpus=float(cpus)),
        network=bool(env.get("allow_internet", False)),
    )


@dataclass
class Verdict:
    reward: float
    reason: str
    tests: dict[str, str] = field(default_factory=dict)


def _copy_tests(session: Session, task: TerminalTask) -> None:
    tests = task.path / "tests"
    for f in sorted(tests.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            session.put_file(f"/tests/{f.relative_to(tests)}", f.read_bytes())
    if task.layout is Layout.TB1:
        session.put_file("/tests/run-tests.sh", task.verifier.read_bytes())


def verify(session: Session, task: TerminalTask) -> Verdict:
    """Run the task's verifier in `session` (after the agent) and compute the reward in [0, 1]."""
    _copy_tests(session, task)
    if task.layout is Layout.TB1:
        r = session.exec("TEST_DIR=/tests bash /tests/run-tests.sh 2>&1", timeout=task.test_timeout)
        if r.timed_out:
            return Verdict(0.0, f"verifier timeout after {task.test_timeout}s")
        by_name: dict[str, Status] = {
            tid.split("::")[-1]: st for tid, st in parse_pytest_log(r.stdout).items()
        }
        tests = {k: v.value for k, v in by_name.items()}
        if not by_name:
            return Verdict(0.0, "no test results in the verifier output", tests)
        if task.weights:
            total = sum(task.weights.values())
            got = sum(w for n, w in task.weights.items() if by_name.get(n) is Status.PASSED)
            return Verdict(got / total, f"weighted: {got:g} of {total:g}", tests)
        failed = [n for n, s in by_name.items() if s is not Status.PASSED]
        return Verdict(
            0.0 if failed else 1.0, f"failed: {failed}" if failed else "all tests passed", tests
        )
    r = session.exec(
        "mkdir -p /logs/verifier && bash /tests/test.sh 2>&1", timeout=task.test_timeout
    )
    if r.timed_out:
        return Verdict(0.0, f"verifier timeout after {task.test_timeout}s")
    raw = session.get_file("/logs/verifier/reward.json")
    if raw is not None:
        try:
            data = json.loads(raw)
            nums = (
                [v for v in data.values() if isinstance(v, int | float)]
                if isinstance(data, dict)
                else []
            )
            value = (
                float(data["reward"])
                if isinstance(data, dict) and "reward" in data
                else sum(nums) / len(nums)
            )
        except (ValueError, TypeError, KeyError, ZeroDivisionError):
            return Verdict(0.0, "reward.json is not a JSON object with numeric values")
        return Verdict(min(1.0, max(0.0, value)), "reward.json")
    raw = session.get_file("/logs/verifier/reward.txt")
    if raw is None:
        return Verdict(0.0, f"verifier wrote no reward (exit {r.exit_code}): {r.stdout[-200:]}")
    try:
        return Verdict(min(1.0, max(0.0, float(raw.decode().strip()))), "reward.txt")
    except ValueError:
        return Verdict(0.0, f"reward.txt is not a float: {raw[:50]!r}")
