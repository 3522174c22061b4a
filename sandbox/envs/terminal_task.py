"""A terminal task as loaded (`TerminalTask`, its steps and limits) and the helpers both
loaders share (`terminal` for TB1 / SETA and the dispatch, `terminal_harbor` for task.toml)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from thundersync.sandbox.executor import Limits, SessionSpec

APP = "/app"
SCRATCH = ("/tests", "/logs")


class Layout(StrEnum):
    TB1 = "tb1"
    HARBOR = "harbor"


class TaskError(ValueError):
    """A malformed task directory; the message names the file, the field and the expectation."""


@dataclass(frozen=True)
class Step:
    """One step of a Harbor multi-step task (`[[steps]]` + steps/<name>/)."""

    name: str
    instruction: str
    agent_timeout: float
    test_timeout: float
    tests: Path | None  # steps/<name>/tests/: copied over the task's tests/ for this step
    solution: Path | None  # steps/<name>/solution/solve.sh
    min_reward: float | None = None  # below it the episode ends (later steps earn 0)


def copies_app(dockerfile: Path) -> bool:
    """The Dockerfile copies the build context's app/ (or the whole context) into /app."""
    from thundersync.sandbox.images import _instructions, _seed_copy

    return any(w in ("COPY", "ADD") and _seed_copy(r) for _, w, r in _instructions(dockerfile))


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
    reward_key: str | None = None  # [verifier] reward_key: the reward.json key trained on
    network_note: str = ""  # where the project's network default differs from the format's
    steps: tuple[Step, ...] = ()  # Harbor [[steps]]: one instruction and verifier each
    step_reward: str = "mean"  # multi_step_reward_strategy: "mean" | "final"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def verifier_network_on(self) -> bool:
        return self.network if self.verifier_network is None else self.verifier_network

    @property
    def app_seed(self) -> Path | None:
        """The task's `app/` (TB1) or `environment/app/` (Harbor) when /app holds it: with a
        Dockerfile only when it copies that folder into /app (on the docker backend the env
        seeds /app from the built image itself); without one, when the folder exists."""
        seed = self.path / ("app" if self.layout is Layout.TB1 else "environment/app")
        if not seed.is_dir():
            return None
        if self.dockerfile is not None and not copies_app(self.dockerfile):
            return None  # e.g. a TB1 app/ holding the solution that the image never gets
        return seed

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


# what a test script does that needs the network (apt / pip / uv / downloads)
NEEDS_NET = re.compile(r"\b(apt-get|apt|pip3?|uv|uvx|curl|wget|npm)\b\s")
