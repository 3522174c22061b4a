"""`SWESmithEnv`: a skyrl-gym env (a `ToolEnv`) for repository bug fixing on SWE-smith instances.

extras:
  instance       a record dict, or an instance_id looked up in `instances_path`
  instances_path JSON / JSONL of records (default: the shipped fixtures)
  repos_dir      directory of git mirrors named after the record's repo (default: fixture mirrors)
  eval_timeout   (300 s); and those of `sandbox.envs.base` (backend, max_turns 30, tool_timeout 60)
The agent works in /testbed on the instance branch's tree (the failing tests removed) as the
one commit of a fresh repository: no history holds the bug diff or the hidden tests. Tools and
the action format are in `sandbox.envs.tools`. On `submit` (or at max_turns) the diff of the
work tree is taken, the agent's session given back, and the diff graded in a fresh session on
the squashed tree of the bug commit with its tests (see `sandbox.envs.swesmith_eval.evaluate`):
reward 1 or 0, the reason in metadata["grade"]. Both trees are per-process squashed checkouts
(`Workspaces`), shared by every env of the instance, so the pool reuses their sessions.
"""

from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import ConversationType

from sandbox.envs.base import ToolEnv
from sandbox.envs.swesmith import (
    RecordError,
    SweInstance,
    load_instances,
    parse_record,
    squashed_checkout,
)
from sandbox.envs.swesmith_eval import REPORT_DIR, Grade, evaluate
from sandbox.envs.tools import TOOL_HELP
from sandbox.executor import Session, SessionSpec

MOUNT = "/testbed"


class Workspaces:
    """Per-process squashed checkouts of instance refs: the (read-only) workdir of SWE sessions.

    `acquire` gives the checkout of (mirror, ref), made on first use and shared while any env
    holds it; `release` drops a hold. At most `keep` checkouts nobody holds are kept (oldest
    deleted first); all go at exit. Sessions copy their workdir, so a checkout is never written.
    """

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._holds: dict[Path, int] = {}  # in use order: the last is the most recent
        self._root: Path | None = None

    def _path(self, mirror: Path, ref: str) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="tsrl-swe-"))
                atexit.register(shutil.rmtree, self._root, True)
            root = self._root
        digest = hashlib.sha256(f"{mirror.resolve()}\0{ref}".encode()).hexdigest()[:12]
        return root / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', ref)[:60]}-{digest}"

    def acquire(self, mirror: Path, ref: str) -> Path:
        path = self._path(mirror, ref)
        with self._lock:
            self._holds[path] = self._holds.pop(path, 0) + 1
            ready = path.exists()
        if ready:
            return path
        tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=path.parent))
        try:
            squashed_checkout(mirror, ref, tmp / "repo")
            with self._lock:
                if not path.exists():
                    (tmp / "repo").rename(path)
        except BaseException:
            self.release(path)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    def release(self, path: Path) -> None:
        with self._lock:
            self._holds[path] = self._holds.get(path, 1) - 1
            idle = [p for p, n in self._holds.items() if n <= 0]
            for p in idle[: max(0, len(idle) - self.keep)]:
                del self._holds[p]
                shutil.rmtree(p, ignore_errors=True)


WORKSPACES = Workspaces()


class SWESmithEnv(ToolEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        extras = dict(extras or {})
        super().__init__(extras)
        from sandbox.envs import fixtures

        self.instance = self._resolve(extras, fixtures.SWESMITH_INSTANCES)
        repos = extras.get("repos_dir")
        self.repos_dir = Path(repos) if repos else fixtures.fixture_mirrors()
        self.mirror = self.repos_dir / self.instance.repo_name
        if not (self.mirror / ".git").exists() and not (self.mirror / "HEAD").exists():
            raise RecordError(
                f"{self.instance.source}: repo {self.instance.repo!r} has no git mirror at "
                f"{self.mirror}; pass extras['repos_dir'] holding <repo name>/ mirrors"
            )
        self.eval_timeout = float(extras.get("eval_timeout", 300))
        self._workspaces: dict[str, Path] = {}
        self.grade: Grade | None = None

    @staticmethod
    def _resolve(extras: dict[str, Any], default_path: Path) -> SweInstance:
        inst = extras.get("instance")
        if isinstance(inst, dict):
            return parse_record(inst, "extras['instance']")
        if isinstance(inst, str):
            path = Path(extras.get("instances_path") or default_path)
            for cand in load_instances(path):
                if cand.instance_id == inst:
                    return cand
            raise RecordError(f"{path}: no record with instance_id {inst!r}")
        raise RecordError("extras['instance'] must be a SWE-smith record (dict) or an instance_id")

    def _spec(self, label: str) -> SessionSpec:
        """The agent's tree (the instance branch) or, for "swe-eval", the bug commit's tree
        with the instance's tests; either as a one-commit repository."""
        ref = self.instance.instance_id + ("~1" if label == "swe-eval" else "")
        if ref not in self._workspaces:
            self._workspaces[ref] = WORKSPACES.acquire(self.mirror, ref)
        scratch = (REPORT_DIR,) if label == "swe-eval" else ()
        return SessionSpec(
            workdir=self._workspaces[ref], mount_at=MOUNT, label=label, scratch=scratch
        )

    def prompt(self) -> ConversationType:
        return [
            {
                "role": "system",
                "content": "You fix bugs in the repository at /testbed.\n" + TOOL_HELP,
            },
            {
                "role": "user",
                "content": self.instance.problem_statement or "Fix the failing behaviour.",
            },
        ]

    def open_session(self) -> Session:
        return self.acquire_session(self._spec("swe"))

    def start(self) -> dict[str, Any]:
        self.grade = None
        return {"instance_id": self.instance.instance_id}

    def model_patch(self) -> str:
        assert self.session is not None
        r = self.session.exec(
            "git add -A >/dev/null 2>&1; git diff --cached --no-color HEAD -- . ':(exclude).tsrl'",
            timeout=60,
        )
        return r.stdout if r.exit_code == 0 else ""

    def evaluate_patch(self, patch: str) -> Grade:
        """Grade `patch` in a session of its own, reset to the instance branch."""
        with self.pool.acquire(self._spec("swe-eval")) as s:
            return evaluate(s, self.instance, patch, timeout=self.eval_timeout)

    def finish(self, note: str) -> tuple[float, dict[str, Any]]:
        patch = self.model_patch()
        self.release_session()  # before grading: an env never holds two leases
        self.grade = self.evaluate_patch(patch)
        return self.grade.reward, {
            "grade": asdict(self.grade),
            "instance_id": self.instance.instance_id,
        }

    def close(self) -> None:
        super().close()
        for path in self._workspaces.values():
            WORKSPACES.release(path)
        self._workspaces = {}
