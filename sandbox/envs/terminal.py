"""Terminal-Bench task directories: TB1 / SETA (task.yaml) and Harbor / TB2 (task.toml).

TB1 / SETA: task.yaml (instruction, max_agent_timeout_sec, max_test_timeout_sec), Dockerfile,
run-tests.sh (optional: Terminal-Bench's default runner is used without it), solution.sh,
tests/test_outputs.py, optional weights.json {test_name: weight} (SETA partial reward = passed
weight / total weight; a weight naming no test function of tests/ is an error; without weights
the reward is 1 only when every test passes). Harbor / TB2: task.toml ([agent] timeout_sec,
[verifier] timeout_sec, [environment] cpus, memory_mb or memory ("2G", "512M"), storage_mb (the
disk quota, default 1024), network: see below), instruction.md, environment/, solution/solve.sh
(optional: a task without it loads for training, its gold is not checked), tests/test.sh; the
reward is read from /logs/verifier/reward.json (its "reward" key, else the mean of its numbers) or
reward.txt. SETA in the Harbor layout adds weights.json (checked as above): the reward is then
passed weight / total weight from the CTRF report tests/test.sh writes to /logs/verifier/ctrf.json.
Harbor network: [environment] network_mode "no-network" | "public" (the baseline; "allowlist" only
with no allowed_hosts, which denies all egress: the sandbox cannot limit egress to hosts), or the
older allow_internet (bool); [agent] / [verifier] network_mode override it for their phase. Both
unset: network off (Harbor's default is on; tasks here must run offline unless they ask).
The agent works in /app, seeded from `app/` (TB1) or `environment/app/` (Harbor) when present.
Images: on the docker backend the task's Dockerfile (TB1 / SETA: `Dockerfile` at the task root,
context the task root; Harbor: `environment/Dockerfile`, context environment/) is built once per
build context by `sandbox.images.ensure_image` (tag `tsrl-task-<name>:<hash12>`, nothing pulled)
and both the agent's and the verifier's sessions run in it. The local backend builds nothing:
tasks run on the sandbox base (python3, pytest, git) and the env's init metadata says so
(`sandbox.images.local_gap`: a Dockerfile that adds to the image then needs --backend docker).
The verifier runs in a session of its own after the agent's (`sandbox.envs.terminal_verify`):
tests are copied in only then; it runs as root (`SessionSpec.exec_user`), as TB1 and Harbor
runners expect, on the docker backend (the local backend keeps uid 65534); the agent never does.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from thundersync.sandbox.executor import Limits, SessionSpec

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
    verifier: Path | None  # run-tests.sh (TB1; None: the default runner) or tests/test.sh
    solution: Path | None  # None: a Harbor task without solution/ (training only)
    weights: dict[str, float] | None = None
    limits: Limits = field(default_factory=Limits)
    network: bool = False  # the agent's session
    verifier_network: bool | None = None  # the verifier's session; None: as `network`

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def app_seed(self) -> Path | None:
        seed = self.path / ("app" if self.layout is Layout.TB1 else "environment/app")
        return seed if seed.is_dir() else None

    @property
    def dockerfile(self) -> Path | None:
        """The task's Dockerfile (built on the docker backend only), None when it has none."""
        f = self.path / ("Dockerfile" if self.layout is Layout.TB1 else "environment/Dockerfile")
        return f if f.is_file() else None

    @property
    def build_context(self) -> Path:
        return self.path if self.layout is Layout.TB1 else self.path / "environment"

    def session_spec(self, image: str | None = None) -> SessionSpec:
        """The agent's session (as the unprivileged sandbox user), in `image` when given."""
        return SessionSpec(
            workdir=self.app_seed,
            mount_at=APP,
            image=image,
            network=self.network,
            limits=self.limits,
            scratch=SCRATCH,
            label=f"term-{self.name}",
        )

    def verify_spec(self, image: str | None = None) -> SessionSpec:
        """The verifier's own session: an empty /app (the agent's is restored into it), the
        same image as the agent's, execs as root (TB1 / Harbor runners may install tools or
        write /data, /output; the docker backend replaces such a container on reset)."""
        return SessionSpec(
            mount_at=APP,
            image=image,
            exec_user="root",
            network=self.network if self.verifier_network is None else self.verifier_network,
            limits=self.limits,
            scratch=SCRATCH,
            label=f"term-verify-{self.name}",
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


def _test_functions(tests: Path) -> set[str]:
    names: set[str] = set()
    for f in sorted(tests.rglob("*.py")) if tests.is_dir() else []:
        try:
            tree = ast.parse(f.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                names.add(node.name)
    return names


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
    known = _test_functions(path.parent / "tests")
    unknown = sorted(k for k in data if k.split("::")[-1] not in known)
    if unknown:
        raise TaskError(
            f"{path}: weight for {unknown[0]!r} names no test function in "
            f"{path.parent / 'tests'} (known: {sorted(known)})"
        )
    return {str(k): float(v) for k, v in data.items()}


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
        verifier=p / "run-tests.sh" if (p / "run-tests.sh").is_file() else None,
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
    network, verifier_network = _network(src, tables)
    if "steps" in meta:
        raise TaskError(
            f"{src}: [[steps]]: multi-step tasks are not supported (one instruction.md)"
        )
    instr = _need(p / "instruction.md", "the task instruction").read_text().strip()
    if not instr:
        raise TaskError(f"{p / 'instruction.md'}: empty; write the task for the agent there")
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
    return TerminalTask(
        path=p,
        layout=Layout.HARBOR,
        instruction=instr,
        agent_timeout=_number(src, tables["agent"], "timeout_sec", 600),
        test_timeout=_number(src, tables["verifier"], "timeout_sec", 120),
        verifier=_need(p / "tests" / "test.sh", "the Harbor verifier"),
        solution=p / "solution/solve.sh" if (p / "solution/solve.sh").is_file() else None,
        weights=_weights(p / "weights.json"),
        limits=Limits(memory_mb=mem, cpus=float(cpus), disk_mb=disk),
        network=network,
        verifier_network=verifier_network,
    )
