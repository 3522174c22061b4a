"""Terminal tasks' images built from their Dockerfiles (docker backend), root verifiers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from thundersync.sandbox import images
from thundersync.sandbox.docker_backend import DockerExecutor
from thundersync.sandbox.envs.check import check_terminal, summarize
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.terminal import load_task
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.executor import SandboxError, SessionSpec
from thundersync.sandbox.local import LocalExecutor

IMAGE_FIXTURES = (
    "tb1-image-seed",
    "harbor-image-tool",
    "seta-image-numbers",
    "tb1-nonroot-user",
    "tb1-app-not-copied",
)


@pytest.fixture(scope="module")
def docker_executor() -> DockerExecutor:
    return DockerExecutor()


@pytest.fixture
def built_tags(docker_executor: DockerExecutor) -> Iterator[list[str]]:
    tags: list[str] = []
    yield tags
    for tag in tags:
        with contextlib.suppress(Exception):
            docker_executor.client.images.remove(tag, force=True)


def test_build_is_cached_and_a_changed_context_gets_a_new_tag(
    tmp_path: Path, docker_executor: DockerExecutor, built_tags: list[str]
) -> None:
    client = docker_executor.client
    (tmp_path / "Dockerfile").write_text(
        "FROM thundersync-sandbox:bookworm\nCOPY seed.txt /data/seed.txt\n"
    )
    (tmp_path / "seed.txt").write_text(uuid.uuid4().hex)  # a context no earlier run built
    before = images.builds
    tag = images.ensure_image(client, "Cache_Test", tmp_path, tmp_path / "Dockerfile")
    built_tags.append(tag)
    assert tag.startswith("tsrl-task-cache_test:") and len(tag.rsplit(":", 1)[1]) == 12
    first = client.images.get(tag).id
    assert images.ensure_image(client, "Cache_Test", tmp_path, tmp_path / "Dockerfile") == tag
    assert images.builds == before + 1 and client.images.get(tag).id == first  # not rebuilt
    (tmp_path / "seed.txt").write_text("changed")
    new = images.ensure_image(client, "Cache_Test", tmp_path, tmp_path / "Dockerfile")
    built_tags.append(new)
    assert new != tag and images.builds == before + 2
    names = {t.split("/")[-1] for img in client.images.list() for t in img.tags}
    assert new in names and tag not in names  # the old context's image was pruned


def test_missing_base_image_names_task_dockerfile_image_and_fix(
    tmp_path: Path, docker_executor: DockerExecutor
) -> None:
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE=tsrl-no-such-base:1\nFROM ${BASE} AS build\nFROM build\n"
    )
    before = images.builds
    with pytest.raises(images.ImageBuildError) as e:
        images.ensure_image(docker_executor.client, "nobase", tmp_path, tmp_path / "Dockerfile")
    msg = str(e.value)
    assert "'nobase'" in msg and str(tmp_path / "Dockerfile") in msg
    assert "'tsrl-no-such-base:1' is not present locally" in msg and "podman tag" in msg
    assert images.builds == before


def test_dockerfile_parsing_and_local_gap(tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text("# c\nFROM --platform=x a:1 AS s1\nFROM s1\nFROM scratch\nRUN echo \\\n  hi\n")
    assert images.base_images(df) == ["a:1"]
    gap = images.local_gap(df)
    assert gap and f"{df}:5: `RUN echo hi`" in gap and "--backend docker" in gap
    df.write_text("FROM thundersync-sandbox:bookworm\nWORKDIR /app\nCOPY app/ /app/\n")
    assert images.local_gap(df) is None
    assert images.local_gap(TERMINAL_DIR / "tb1-image-seed" / "Dockerfile")


def test_image_fixtures_gold_one_noop_zero_on_docker_with_root_verifier(
    docker_executor: DockerExecutor,
) -> None:
    details = [check_terminal(TERMINAL_DIR / name, docker_executor) for name in IMAGE_FIXTURES]
    summary = summarize(details)
    assert summary["gold_ok"] == summary["noop_ok"] == len(IMAGE_FIXTURES), details
    assert {d["kind"] for d in details} == {"tb1", "harbor"}
    # the same built image serves the agent's and the verifier's sessions
    task = load_task(TERMINAL_DIR / "tb1-image-seed")
    env = TerminalEnv(extras={"task": task, "executor": docker_executor})
    try:
        _, meta = env.init([])
        assert meta["image"].startswith("tsrl-task-tb1-image-seed:")
        assert env.session is not None
        r = env.session.exec("id -u; cat /data/input.txt")
        assert r.stdout.split()[0] == "65534" and "seed from the task image" in r.stdout
        assert env.task.verify_spec(meta["image"]).image == meta["image"]
    finally:
        env.close()


def test_root_session_kills_leftovers_and_is_replaced_on_reset(
    docker_executor: DockerExecutor,
) -> None:
    with pytest.raises(SandboxError, match="exec_user must be None"):
        docker_executor.open(SessionSpec(exec_user="no such user"))
    with pytest.raises(SandboxError, match="is root; agents never are"):
        docker_executor.open(SessionSpec(exec_user="0:0"))
    with pytest.raises(SandboxError, match="does not exist in it"):
        docker_executor.open(SessionSpec(exec_user="nobody-here"))
    s = docker_executor.open(SessionSpec(exec_user="root", label="root-test"))
    try:
        r = s.exec("id -u; echo x > /etc/tsrl-root-mark; (sleep 300 &) ; sleep 300 & echo ok")
        assert r.stdout.split() == ["0", "ok"], r
        left = s.exec("cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep; echo alive")
        assert left.stdout.split() == ["1", "alive"], left  # only `sleep infinity`
        s.put_file("a.txt", b"as the sandbox user")
        assert s.exec("stat -c %u /task/a.txt").stdout.strip() == "65534"  # file tools: not root
        first = s.container.id  # type: ignore[attr-defined]
        s.reset()
        assert s.container.id != first  # type: ignore[attr-defined]
        assert s.exec("cat /etc/tsrl-root-mark").exit_code != 0
    finally:
        s.close()


def test_local_backend_builds_nothing_and_reports_image_tasks(
    local_executor: LocalExecutor,
) -> None:
    out = check_terminal(TERMINAL_DIR / "tb1-image-seed", local_executor)
    assert "needs docker" in out["skipped"] and "Dockerfile:3" in out["skipped"]
    summary = summarize([out])
    assert summary["tasks"] == 0 and summary["skipped"][0]["task"] == "tb1-image-seed"
    env = TerminalEnv(extras={"task": str(TERMINAL_DIR / "tb1-image-seed"), "backend": "local"})
    try:
        _, meta = env.init([])
        assert meta["image"] is None and "Dockerfile not built" in meta["image_note"]
    finally:
        env.close()


def test_local_catalogue_leaves_out_fixtures_needing_their_image() -> None:
    from thundersync.config import load_run_config
    from thundersync.sandbox.envs.catalogue import terminal_tasks

    names = {
        sb: {r.name for r in terminal_tasks(load_run_config(overrides={"env.sandbox": sb}))}
        for sb in ("local", "docker")
    }
    assert set(IMAGE_FIXTURES) <= names["docker"] and not set(IMAGE_FIXTURES) & names["local"]
    assert names["docker"] - names["local"] == set(IMAGE_FIXTURES)


def test_agent_runs_as_the_images_user_and_reset_keeps_its_files(
    tmp_path: Path, docker_executor: DockerExecutor, built_tags: list[str]
) -> None:
    """A Dockerfile's non-root USER is the agent's user (commands and file tools); the image's
    files of that user survive a reset (the container is replaced, not wiped by uid)."""
    import shutil

    task = tmp_path / "tb1-user"
    shutil.copytree(TERMINAL_DIR / "tb1-hello-file", task)
    (task / "Dockerfile").write_text(
        "FROM thundersync-sandbox:bookworm\n"
        "RUN echo 'builder:x:1234:1234::/home/builder:/bin/sh' >> /etc/passwd && "
        "echo 'builder:x:1234:' >> /etc/group && mkdir -p /home/builder && "
        "echo keep > /home/builder/own.txt && chown -R 1234:1234 /home/builder\n"
        "USER builder\nWORKDIR /app\n"
    )
    env = TerminalEnv(extras={"task": str(task), "executor": docker_executor})
    try:
        env.init()
        built_tags.append(str(env.image()))
        env.step('<tool>create\n{"path": "made.txt", "content": "x"}</tool>')
        out = env.step(
            "<tool>bash\nid -u; stat -c %u /app/made.txt; cat /home/builder/own.txt</tool>"
        )
        assert out["observations"][0]["content"].split()[:3] == ["1234", "1234", "keep"], out
        env.init()  # a reset: the image's own file is still there, the agent's is gone
        out = env.step("<tool>bash\ncat /home/builder/own.txt; ls /app</tool>")
        assert out["observations"][0]["content"].split()[0] == "keep"
        assert "made.txt" not in out["observations"][0]["content"]
    finally:
        env.close()
