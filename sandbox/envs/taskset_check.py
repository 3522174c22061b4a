"""The task-set check before a run starts: every task the run would draw can run on its backend.

Run at submission (POST /runs: a 422 naming each task and why) and when `tsrl train` starts
(before any model, engine or sandbox starts), on exactly the task list the driver would use
(`catalogue.tasks_for`), so a task the backend cannot run is refused up front instead of failing
the run when a seed first draws it. Checked cheaply and statically:
- the task loads as its env reads it (formats, fields: `load_task`, `load_instances`);
- the verifier is there and parses (TB1: run-tests.sh, else tests/test_outputs.py for the default
  runner; Harbor: tests/test.sh and each step's; shell scripts pass `bash -n`);
- the backend can run it: on `local` a Dockerfile that adds to the image (`images.local_gap`) or
  a SWE-smith record with no git mirror (its image_name is not used there) is refused;
- on `docker`, with an engine client given: every image the task needs (the Dockerfile's bases, a
  record's image_name, the sandbox base) is present, mapped by `env.image_map` or pullable
  (`env.image_pull`); with `prepare`, mapped images are tagged and pulls done now
  (`images.ensure_present`). Without a client (the service's submission check) images are left
  to the start of the run, which checks them again with the engine.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thundersync.config import RunConfig
    from thundersync.sandbox.envs.catalogue import TaskRef

SET = "(task set)"  # the name of a problem with the whole set (unreadable file, no tasks)


@dataclass(frozen=True)
class TaskProblem:
    task: str
    reason: str


class TaskSetError(ValueError):
    """Tasks of the run's set that cannot run; the message names each and the reason."""

    def __init__(self, problems: list[TaskProblem], backend: str, total: int) -> None:
        self.problems = problems
        shown = "; ".join(f"task {p.task!r}: {p.reason}" for p in problems[:5])
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        super().__init__(
            f"env.tasks: {len(problems)} of {total} task(s) cannot run on the {backend} "
            f"backend: {shown}{more}"
        )


def _bash_syntax(script: Path) -> str | None:
    try:
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{script}: cannot be syntax-checked ({e})"
    if r.returncode != 0:
        return f"{script}: not a valid shell script (`bash -n`: {r.stderr.strip()[-300:]})"
    return None


def verifier_problem(task: Any) -> str | None:
    """Why `task`'s verifier (a loaded `TerminalTask`) cannot run, or None."""
    from thundersync.sandbox.envs.terminal import Layout

    scripts: list[Path] = []
    if task.layout is Layout.TB1 and task.verifier is None:
        default = task.path / "tests" / "test_outputs.py"
        if not default.is_file():
            return (
                f"{default}: missing; without run-tests.sh the default runner runs it: add "
                "tests/test_outputs.py or a run-tests.sh"
            )
    if task.verifier is not None:
        scripts.append(task.verifier)
    scripts += [
        s.tests / "test.sh" for s in task.steps if s.tests and (s.tests / "test.sh").is_file()
    ]
    for script in scripts:
        if not script.is_file():
            return f"{script}: missing (the task's verifier)"
        bad = _bash_syntax(script)
        if bad:
            return bad
    return None


class _Images:
    """Image checks on the docker backend through one engine client (None: not checked)."""

    def __init__(self, client: Any, image_map: dict[str, str], pull: bool, prepare: bool) -> None:
        self.client, self.map, self.pull, self.prepare = client, image_map, pull, prepare
        self.seen: dict[tuple[str, str], str | None] = {}

    def problem(self, image: str, what: str) -> str | None:
        if self.client is None:
            return None
        import docker.errors

        from thundersync.sandbox.images import ImageBuildError, ensure_present

        if (image, what) not in self.seen:
            try:
                ensure_present(
                    self.client,
                    image,
                    what,
                    image_map=self.map,
                    pull=self.pull,
                    apply=self.prepare,
                )
                self.seen[image, what] = None
            except ImageBuildError as e:
                self.seen[image, what] = str(e)
            except docker.errors.DockerException as e:  # the engine refused the tag, ...
                self.seen[image, what] = f"{what} {image!r}: the engine failed ({e})"
        return self.seen[image, what]


def _terminal(ref: TaskRef, backend: str, images: _Images, base: str) -> str | None:
    from thundersync.sandbox.envs.terminal import load_task
    from thundersync.sandbox.images import base_images, local_gap

    try:
        task = load_task(ref.extras["task"])
    except (ValueError, OSError) as e:  # TaskError, or e.g. a task file that is not UTF-8
        return str(e)
    bad = verifier_problem(task)
    if bad:
        return bad
    if backend == "local":
        gap = local_gap(task.dockerfile)
        return f"needs the docker backend (env.sandbox=docker): {gap}" if gap else None
    if task.dockerfile is None:
        return images.problem(base, "the sandbox base image")
    for image in base_images(task.dockerfile):
        bad = images.problem(image, f"{task.dockerfile}: base image")
        if bad:
            return bad
    return None


def _mirror_of(inst: Any) -> Path:
    from thundersync.sandbox.envs import fixtures
    from thundersync.sandbox.envs.swesmith_env import record_repos

    repos = record_repos(inst)
    if repos is None:  # the fixture mirrors: built from these sources on first use
        return fixtures.SWESMITH_DIR / "repos" / inst.repo_name
    return repos / inst.repo_name


def record_problem(inst: Any) -> str | None:
    """Why a SWE-smith record cannot be graded whatever the backend, or None: an image_name
    whose repo no profile knows (neither registered nor a SWE-smith mirror name), so nothing
    says how to test it in that image (`tsrl data import`, `tsrl env check` and this check)."""
    from thundersync.sandbox.envs import swesmith_profiles as sp

    name = inst.repo.rstrip("/").split("/")[-1]
    known = sp.profile_for(inst.repo) is not sp.DEFAULT or any(
        k.lower() in sp.registered() for k in (inst.repo, name)
    )
    if not inst.image_name or known:
        return None
    return (
        f"{inst.source}: field 'repo' {inst.repo!r} has no repository profile (install and test "
        f"commands), so image {inst.image_name!r} cannot be graded: name the SWE-smith mirror "
        "(`swesmith/<owner>__<repo>.<commit8>`), register a profile "
        "(sandbox.envs.swesmith_profiles.register), or drop image_name to use a git mirror"
    )


def _swe(
    ref: TaskRef, backend: str, images: _Images, base: str, insts: dict[str, Any]
) -> str | None:
    from thundersync.sandbox.envs import fixtures
    from thundersync.sandbox.envs.swesmith import RecordError

    inst = insts[ref.extras["instance"]]
    bad = record_problem(inst)
    if bad:
        return bad
    if backend == "docker" and inst.image_name:
        if fixtures.is_fixture_image(inst.image_name):
            return None  # built on first use from the shipped fixture repository
        return images.problem(inst.image_name, f"{inst.source}: field 'image_name': image")
    try:
        mirror = _mirror_of(inst)
    except RecordError as e:
        return str(e)
    if not mirror.exists():
        why = (
            f"; its image_name {inst.image_name!r} is not used on the local backend "
            "(env.sandbox=docker runs it)"
            if inst.image_name
            else ""
        )
        return f"{inst.source}: repo {inst.repo!r} has no git mirror at {mirror}{why}"
    return images.problem(base, "the sandbox base image") if backend == "docker" else None


def check_task_set(
    cfg: RunConfig, client: Any = None, *, base_image: str | None = None, prepare: bool = False
) -> tuple[list[TaskProblem], int]:
    """(problems, number of tasks) of the run's task set on its backend; `client` (a docker SDK
    client) enables the image checks (`base_image`: the executor's sandbox image), `prepare`
    applies the image map and pulls."""
    from thundersync.sandbox.envs import EnvId
    from thundersync.sandbox.envs.catalogue import tasks_for
    from thundersync.sandbox.envs.swesmith import RecordError, load_instances
    from thundersync.sandbox.envs.terminal import TaskError
    from thundersync.sandbox.images import configure

    backend = str(cfg.env.sandbox)
    if prepare:  # this process's later image builds (ensure_image) use the same map
        configure(cfg.env.image_map, cfg.env.image_pull)
    tasks = Path(cfg.env.tasks or "")
    if cfg.env.tasks and any((tasks / f).is_file() for f in ("task.yaml", "task.toml")):
        return [TaskProblem(SET, f"env.tasks {tasks} is one task; give the folder holding it")], 0
    try:
        refs = tasks_for(cfg)
    except (RecordError, TaskError, OSError, ValueError) as e:  # ValueError: a dataset row
        return [TaskProblem(SET, f"{cfg.env.tasks}: {e}" if isinstance(e, OSError) else str(e))], 0
    if not refs:
        return [TaskProblem(SET, f"env.tasks {cfg.env.tasks!r} holds no tasks")], 0
    images = _Images(client, cfg.env.image_map, cfg.env.image_pull, prepare)
    base = base_image or os.environ.get("TSRL_SANDBOX_IMAGE", "thundersync-sandbox:bookworm")
    insts: dict[str, Any] = {}
    problems = []
    for ref in refs:
        if ref.env_id == EnvId.TERMINAL.value:
            bad = _terminal(ref, backend, images, base)
        elif ref.env_id == EnvId.SWESMITH.value:
            if not insts:
                insts = {i.instance_id: i for i in load_instances(ref.extras["instances_path"])}
            bad = _swe(ref, backend, images, base, insts)
        else:
            bad = None  # the toy env needs nothing but the sandbox
        if bad:
            problems.append(TaskProblem(ref.name, bad))
    return problems, len(refs)


def require_runnable(
    cfg: RunConfig, client: Any = None, *, base_image: str | None = None, prepare: bool = False
) -> int:
    """The number of tasks, or `TaskSetError` naming every task that cannot run."""
    problems, total = check_task_set(cfg, client, base_image=base_image, prepare=prepare)
    if problems:
        raise TaskSetError(problems, str(cfg.env.sandbox), total)
    return total


def check_before_start(cfg: RunConfig) -> int:
    """`tsrl train`'s check, before anything heavy starts: the task set with the engine's image
    checks on the docker backend (mapped images tagged, pulls done); `TaskSetError` otherwise."""
    from thundersync.sandbox.executor import SandboxError

    client, base = None, None
    if str(cfg.env.sandbox) == "docker" and cfg.env.name.value != "toy":
        from thundersync.sandbox.backends import get_executor

        try:
            ex = get_executor("docker")
        except SandboxError as e:
            raise TaskSetError([TaskProblem(SET, f"no docker engine: {e}")], "docker", 0) from None
        client, base = ex.client, ex.image  # type: ignore[attr-defined]
    return require_runnable(cfg, client, base_image=base, prepare=True)
