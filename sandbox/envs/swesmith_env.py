"""`SWESmithEnv`: a skyrl-gym env (a `ToolEnv`) for repository bug fixing on SWE-smith instances.

extras:
  instance       a record dict, or an instance_id looked up in `instances_path`
  instances_path JSON / JSONL of records (default: the shipped fixtures)
  repos_dir      directory of git mirrors named after the record's repo (default: the record's
                 `repos_dir`, relative to its task set file, else the fixture mirrors)
  eval_timeout   (300 s); and those of `sandbox.envs.base` (backend, max_turns 30, tool_timeout 60)
The agent works in /testbed on the instance branch's tree (the failing tests removed) as the
one commit of a fresh repository: no history holds the bug diff or the hidden tests. Tools and
the action format are in `sandbox.envs.tools`. On `submit` (or at max_turns) the diff of the
work tree is taken (by a git that reads none of the agent's .git configuration, hooks or
attribute drivers: `sandbox.envs.grader_git`), the agent's session given back, and the diff graded in a fresh session on
the squashed tree of the bug commit with its tests (see `sandbox.envs.swesmith_eval.evaluate`):
reward 1 or 0, the reason in metadata["grade"]. Both trees are per-process squashed checkouts
(`Workspaces`), shared by every env of the instance, so the pool reuses their sessions.
On the docker backend both sessions run the record's `image_name` (missing: `ImageMissing` naming
the instance, the image and the fix); when that image holds the repo at /testbed (SWE-smith's
layout) both trees come from it (`instance_tree`: bug applied, no image history) instead of the
mirror, and a conda env `testbed` in the image leads PATH. The local backend ignores image_name.
The shipped fixture records that name a `swesmith.x86_64.thundersync-fixtures__*` image get it
built on first use from the sandbox base (`fixtures.ensure_swesmith_image`).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any

from skyrl_gym.envs.base_text_env import ConversationType

from thundersync.sandbox.envs.base import ToolEnv
from thundersync.sandbox.envs.grader_git import patch_script
from thundersync.sandbox.envs.swesmith import (
    RecordError,
    SweInstance,
    export_image_dir,
    image_has,
    instance_tree,
    load_instances,
    parse_record,
    require_image,
    squashed_checkout,
)
from thundersync.sandbox.envs.swesmith_eval import REPORT_DIR, Grade, evaluate
from thundersync.sandbox.envs.swesmith_profiles import (
    CONDA_ENV,
    CONDA_ENV_BIN,
    DEFAULT_PATH,
    IMAGE_REPO_DIR,
)
from thundersync.sandbox.envs.tools import TOOL_HELP
from thundersync.sandbox.executor import Backend, SandboxError, Session, SessionSpec

MOUNT = IMAGE_REPO_DIR  # the agent's repo is where SWE-smith images keep it


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

    def root(self) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="tsrl-swe-"))
                atexit.register(shutil.rmtree, self._root, True)
            return self._root

    def acquire(self, mirror: Path, ref: str) -> Path:
        return self.acquire_built(
            f"{mirror.resolve()}\0{ref}", ref, lambda dest: squashed_checkout(mirror, ref, dest)
        )

    def acquire_built(self, key: str, name: str, build: Callable[[Path], object]) -> Path:
        """The tree `build(dest)` makes for `key`, built on first use (see `acquire`)."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        path = self.root() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:60]}-{digest}"
        with self._lock:
            self._holds[path] = self._holds.pop(path, 0) + 1
            ready = path.exists()
        if ready:
            return path
        tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=path.parent))
        try:
            build(tmp / "repo")
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
_IMAGES: dict[str, tuple[Path | None, dict[str, str]]] = {}  # image id -> (repo tree, env)
_IMAGES_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def image_layout(client: Any, inst: SweInstance) -> tuple[str, Path | None, dict[str, str]]:
    """(image id, the image's clean repo exported once per process or None when the image has
    no repo at /testbed, the session env: PATH with the conda env first when the image has it)."""
    img = require_image(client, inst)
    with _IMAGES_LOCK:
        if img.id not in _IMAGES:
            env: dict[str, str] = {}
            if image_has(client, img.id, f"{CONDA_ENV_BIN}/python"):
                pairs = (e.split("=", 1) for e in (img.attrs.get("Config") or {}).get("Env") or [])
                path = dict(p for p in pairs if len(p) == 2).get("PATH", DEFAULT_PATH)
                env = {"PATH": f"{CONDA_ENV_BIN}:{path}", "CONDA_DEFAULT_ENV": CONDA_ENV}
            dest = WORKSPACES.root() / f"image-{img.id.split(':')[-1][:16]}"
            shutil.rmtree(dest, ignore_errors=True)
            has_repo = export_image_dir(client, img.id, IMAGE_REPO_DIR, dest)
            _IMAGES[img.id] = (dest if has_repo else None, env)
        tree, env = _IMAGES[img.id]
    return img.id, tree, env


def record_repos(inst: SweInstance) -> Path | None:
    """A record's `repos_dir`: relative to its task set's directory and inside it, so a task
    set (an uploaded one too) can only name mirrors that travel with it."""
    if not inst.repos_dir:
        return None
    rel = PurePosixPath(inst.repos_dir)
    if rel.is_absolute() or ".." in rel.parts:
        raise RecordError(
            f"{inst.source}: field 'repos_dir' must be a relative path inside the task set's "
            f"directory, not {inst.repos_dir!r} (`tsrl data import --repos-dir` writes one)"
        )
    source = Path(re.sub(r"(:\d+|\[\d+\])$", "", inst.source))
    if not source.is_file():
        raise RecordError(f"{inst.source}: field 'repos_dir' needs the record's task set file")
    return source.parent / rel


class SWESmithEnv(ToolEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        extras = dict(extras or {})
        super().__init__(extras)
        from thundersync.sandbox.envs import fixtures

        self.instance = inst = self._resolve(extras, fixtures.SWESMITH_INSTANCES)
        self.eval_timeout = float(extras.get("eval_timeout", 300))
        self._workspaces: dict[str, Path] = {}
        self.grade: Grade | None = None
        # docker: the record's image runs both sessions; its repo (when it has one) is the tree
        self.image: str | None = None
        self.image_tree: Path | None = None
        self._image_id = ""
        self._session_env: dict[str, str] = {}
        docker = str(getattr(self.backend, "backend", self.backend)) == Backend.DOCKER.value
        if inst.image_name and docker:
            client = getattr(self.pool.executor, "client", None)
            if client is None:
                raise SandboxError(f"{inst.source}: the docker executor has no docker client")
            self.image = inst.image_name
            if fixtures.is_fixture_image(inst.image_name):  # shipped: built here, never pulled
                fixtures.ensure_swesmith_image(client, inst.image_name)
            self._image_id, self.image_tree, self._session_env = image_layout(client, inst)
        elif inst.image_name:
            log.info(
                "%s: image_name %r is not used on the local backend", inst.source, inst.image_name
            )
        repos = extras.get("repos_dir")
        self.repos_dir = Path(repos) if repos else record_repos(inst) or fixtures.fixture_mirrors()
        self.mirror = self.repos_dir / inst.repo_name
        has_mirror = (self.mirror / ".git").exists() or (self.mirror / "HEAD").exists()
        if self.image_tree is None and not has_mirror:
            why = (
                f"image {self.image!r} has no repo at {IMAGE_REPO_DIR}"
                if self.image
                else f"image_name {inst.image_name!r} is not used on the local backend"
                if inst.image_name
                else "the record names no image"
            )
            raise RecordError(
                f"{inst.source}: repo {inst.repo!r} has no git mirror at {self.mirror} ({why}); "
                "pass extras['repos_dir'] holding <repo name>/ mirrors"
            )

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

    def _tree(self, label: str) -> Path:
        """The agent's tree (the bug, its failing tests removed) or, for "swe-eval", the bug
        with the instance's tests; either as a one-commit repository."""
        inst, hide = self.instance, label != "swe-eval"
        base = self.image_tree
        if base is None:
            return WORKSPACES.acquire(self.mirror, inst.instance_id + ("" if hide else "~1"))
        digest = hashlib.sha256(f"{inst.patch}\0{inst.fail_to_pass}".encode()).hexdigest()
        return WORKSPACES.acquire_built(
            f"image\0{self._image_id}\0{inst.instance_id}\0{digest}\0{hide}",
            inst.instance_id + ("" if hide else "-eval"),
            lambda dest: instance_tree(base, inst, dest, hide_tests=hide),
        )

    def _spec(self, label: str) -> SessionSpec:
        if label not in self._workspaces:
            self._workspaces[label] = self._tree(label)
        scratch = (REPORT_DIR,) if label == "swe-eval" else ()
        return SessionSpec(
            workdir=self._workspaces[label],
            mount_at=MOUNT,
            image=self.image,
            env=dict(self._session_env),
            label=label,
            scratch=scratch,
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
        """The diff of the agent's tree against the commit the grader made, by a git that reads
        none of the agent's repository configuration (`grader_git.patch_script`)."""
        assert self.session is not None
        base = self._base_commit()
        r = self.session.exec(patch_script(base, self.session.workdir_inside), timeout=60)
        return r.stdout if r.exit_code == 0 else ""

    def _base_commit(self) -> str:
        """HEAD of the agent tree's grader-made checkout (on the host, never the agent's .git)."""
        tree = self._workspaces.get("swe") or self._spec("swe").workdir
        r = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--verify", "HEAD^{commit}"],
            capture_output=True,
            text=True,
            env={
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": "/dev/null",
                "PATH": DEFAULT_PATH,
            },
        )
        if r.returncode != 0:
            raise SandboxError(f"{tree}: no base commit for the patch: {r.stderr.strip()[-300:]}")
        return r.stdout.strip()

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
