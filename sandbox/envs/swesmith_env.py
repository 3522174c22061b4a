"""`SWESmithEnv`: a skyrl-gym BaseTextEnv for repository bug fixing on SWE-smith instances.

extras:
  instance       a record dict, or an instance_id looked up in `instances_path`
  instances_path JSON / JSONL of records (default: the shipped fixtures)
  repos_dir      directory of git mirrors named after the record's repo (default: fixture mirrors)
  backend        "local" | "docker" (default local); max_turns (30); tool_timeout (60 s);
  eval_timeout   (300 s)
The agent works in /testbed on the instance branch (the failing tests removed); tools and the
action format are in `sandbox.envs.tools`. On `submit` (or at max_turns) the diff of the work
tree is graded in a *fresh* session (see `sandbox.envs.swesmith.evaluate`): reward 1 or 0, the
reason in metadata["grade"].
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from sandbox.envs.swesmith import (
    Grade,
    RecordError,
    SweInstance,
    clone_instance,
    evaluate,
    load_instances,
    parse_record,
)
from sandbox.envs.tools import TOOL_HELP, Tool, ToolCallError, parse_action, run_tool
from sandbox.executor import Executor, Session, SessionSpec, get_executor

MOUNT = "/testbed"


class SWESmithEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
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
        self.max_turns = int(extras.get("max_turns", 30))
        self.tool_timeout = float(extras.get("tool_timeout", 60))
        self.eval_timeout = float(extras.get("eval_timeout", 300))
        self.executor: Executor = extras.get("executor") or get_executor(
            extras.get("backend", "local")
        )
        self._tmp: Path | None = None
        self.session: Session | None = None
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

    def _workspace(self) -> Path:
        tmp = Path(tempfile.mkdtemp(prefix="tsrl-swe-"))
        return clone_instance(self.mirror, self.instance.instance_id, tmp / "repo")

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

    def init(
        self, prompt: ConversationType | None = None
    ) -> tuple[ConversationType, dict[str, Any]]:
        self.close()
        work = self._workspace()
        self._tmp = work.parent
        self.session = self.executor.open(SessionSpec(workdir=work, mount_at=MOUNT, label="swe"))
        self.turns = 0
        self.grade = None
        return (prompt or self.prompt()), {"instance_id": self.instance.instance_id}

    def model_patch(self) -> str:
        assert self.session is not None
        r = self.session.exec(
            "git add -A >/dev/null 2>&1; git diff --cached --no-color HEAD -- . ':(exclude).tsrl'",
            timeout=60,
        )
        return r.stdout if r.exit_code == 0 else ""

    def evaluate_patch(self, patch: str) -> Grade:
        tmp = Path(tempfile.mkdtemp(prefix="tsrl-swe-eval-"))
        try:
            work = clone_instance(self.mirror, self.instance.instance_id, tmp / "repo")
            s = self.executor.open(SessionSpec(workdir=work, mount_at=MOUNT, label="swe-eval"))
            try:
                return evaluate(s, self.instance, patch, timeout=self.eval_timeout)
            finally:
                s.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _finish(self, note: str) -> BaseTextEnvStepOutput:
        self.grade = self.evaluate_patch(self.model_patch())
        meta = {"grade": asdict(self.grade), "instance_id": self.instance.instance_id, "end": note}
        return BaseTextEnvStepOutput(
            observations=[], reward=self.grade.reward, done=True, metadata=meta
        )

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.session is None:
            raise RuntimeError("call init() before step()")
        self.turns += 1
        try:
            call = parse_action(action)
            if call.tool is Tool.SUBMIT:
                return self._finish("submit")
            obs = run_tool(self.session, call, self.tool_timeout)
        except ToolCallError as e:
            obs = f"error: {e}"
        if self.turns >= self.max_turns:
            return self._finish("max_turns")
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": obs}], reward=0.0, done=False, metadata={}
        )

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
