"""The SWE-smith grader against hack families (issue 35), not instances: agent git configuration,
patches writing `.git`, skip / xfail decided by package code, and tool calls no tool can take.
Real git, GNU patch, pytest and local sandboxes; the end-to-end hacks are in
`sandbox.envs.hacks_grader` (the last test runs them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from thundersync.sandbox.envs.fixtures import SWESMITH_DIR
from thundersync.sandbox.envs.grader_git import APPLY, git_paths, patch_script
from thundersync.sandbox.envs.hacks import run_hacks
from thundersync.sandbox.envs.hacks_grader import FORGED_GIT_PATCH, HACKS_GRADER
from thundersync.sandbox.envs.junit import Status
from thundersync.sandbox.envs.swesmith_env import SWESmithEnv
from thundersync.sandbox.envs.swesmith_eval import (
    GUARD_SOURCE,
    LAUNCHER_SOURCE,
    guard_backed,
    guard_findings,
    runner_edits,
)
from thundersync.sandbox.local import LocalExecutor

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "i"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    return repo, head.stdout.strip()


def test_patch_extraction_reads_none_of_the_agents_git_configuration(tmp_path: Path) -> None:
    """diff.external, textconv, a clean filter, fsmonitor and hooks set in the agent's repository
    neither run nor change the patch: it is the real diff."""
    repo, head = _repo(tmp_path)
    ran = tmp_path / "ran"
    prog = tmp_path / "prog.sh"
    prog.write_text(f"#!/bin/sh\necho ran >> {ran}\necho FORGED\n")
    prog.chmod(0o755)
    for key in ("diff.external", "core.fsmonitor", "filter.f.clean", "diff.t.textconv"):
        subprocess.run(["git", "config", key, str(prog)], cwd=repo, check=True)
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    shutil.copy(prog, hooks / "pre-commit")
    (repo / ".gitattributes").write_text("*.py filter=f diff=t\n")
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 1\n")
    r = subprocess.run(
        ["bash", "-c", patch_script(head, str(repo))], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "FORGED" not in r.stdout and not ran.exists(), r.stdout
    assert "-x = 1\n+x = 2" in r.stdout and "+y = 1" in r.stdout and "b/.gitattributes" in r.stdout


@pytest.mark.parametrize(
    "header",
    [
        "diff --git a/.git/hooks/x b/.git/hooks/x",
        "+++ b/.git/config",
        "--- a/sub/.git/info/attributes",
        "Index: .git/hooks/post-checkout",
        "rename to .git/hooks/pre-commit",
        "diff --git a/.gitattributes b/.gitattributes",
    ],
)
def test_patches_naming_git_files_are_refused(header: str) -> None:
    patch = f"diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n{header}\n"
    assert git_paths(patch) and any("git's own files" in w for w in runner_edits(patch))
    assert git_paths(patch.replace(".git", ".github")) == []


def test_the_fuzz_fallback_cannot_write_under_git(tmp_path: Path) -> None:
    """A patch git apply refuses (a .git path) reaches `patch --fuzz`, which would create the
    hook; with .git moved aside it makes a new .git instead, and the apply is refused."""
    repo, _ = _repo(tmp_path)
    patch = tmp_path / "p.diff"
    patch.write_text(FORGED_GIT_PATCH)
    r = subprocess.run(
        ["bash", "-c", APPLY, "apply", str(repo), str(patch)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "APPLY_FAILED" in r.stdout, r.stdout + r.stderr
    assert not (repo / ".git" / "hooks" / "post-checkout").exists()
    assert (repo / ".git" / "HEAD").is_file()  # the tree's own .git is back


def _guarded_run(tmp_path: Path, package_code: str, tests: str) -> dict[str, object]:
    """The fixture repo with `package_code` in minicalc/ops.py and tests/test_x.py = `tests`,
    run through the grader's launcher and guard."""
    repo = tmp_path / "repo"
    shutil.copytree(SWESMITH_DIR / "repos" / "minicalc", repo)
    with (repo / "minicalc" / "ops.py").open("a") as f:
        f.write(package_code)
    (repo / "tests" / "test_x.py").write_text(tests)
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "tsrl_pytest_guard.py").write_bytes(GUARD_SOURCE)
    (guard / "tsrl_run_pytest.py").write_bytes(LAUNCHER_SOURCE)
    (guard / "tsrl_key").write_bytes(b"k")
    env = {
        "PYTHONPATH": str(guard),
        "TSRL_GUARD_OUT": str(guard / "out.json"),
        "TSRL_CWD_FIRST": "1",
        "PATH": os.environ["PATH"],
    }
    cmd = [sys.executable, str(guard / "tsrl_run_pytest.py"), "-q", "-p", "no:cacheprovider"]
    subprocess.run([*cmd, "tests/test_x.py"], cwd=repo, env=env, timeout=120)
    return json.loads((guard / "out.json").read_text())


def test_skip_and_xfail_count_only_where_the_tests_decide_them(tmp_path: Path) -> None:
    package = (
        "\ndef later():\n    import pytest\n    pytest.xfail('later')\n"
        "\ndef skipper():\n    import pytest\n    pytest.skip('no')\n"
    )
    tests = (
        "import pytest\nfrom minicalc import ops\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_marked():\n    assert 0\n\n"
        "def test_own_skip():\n    pytest.skip('not here')\n\n"
        "def test_pkg_xfail():\n    ops.later()\n\n"
        "def test_pkg_skip():\n    ops.skipper()\n\n"
        "def test_ok():\n    assert ops.add(1, 1) == 2\n"
    )
    out = _guarded_run(tmp_path, package, tests)
    assert not (tmp_path / "guard" / "tsrl_key").exists()  # gone before any test code ran
    seen = out["tests"]
    assert isinstance(seen, dict) and out["tampered"] == [], out
    t = "tests/test_x.py::"
    assert seen[t + "test_marked"] == "xfailed" and seen[t + "test_own_skip"] == "skipped"
    assert seen[t + "test_pkg_xfail"] == "failed" and seen[t + "test_pkg_skip"] == "failed"
    assert seen[t + "test_ok"] == "passed"
    reported = {
        t + "test_marked": Status.XFAIL,
        t + "test_own_skip": Status.SKIPPED,
        t + "test_pkg_xfail": Status.XFAIL,
        t + "test_pkg_skip": Status.SKIPPED,
    }
    backed, notes = guard_backed(json.dumps(out).encode(), reported, b"k")
    assert backed[t + "test_marked"] is Status.XFAIL
    assert backed[t + "test_own_skip"] is Status.SKIPPED
    assert backed[t + "test_pkg_xfail"] is Status.FAILED
    assert backed[t + "test_pkg_skip"] is Status.FAILED
    assert any("minicalc/ops.py" in n for n in notes), notes
    forged = dict(out, tests=dict(seen, **{t + "test_pkg_xfail": "xfailed"}))
    assert "not signed" in guard_findings(json.dumps(forged).encode(), {}, b"k")[0]


def test_an_xfail_marker_added_by_package_code_is_not_the_tests(tmp_path: Path) -> None:
    package = (
        "\nimport gc as _gc, pytest as _pt\n"
        "def mark_all():\n"
        "    for o in _gc.get_objects():\n"
        "        if isinstance(o, _pt.Item):\n"
        "            o.add_marker(_pt.mark.xfail(reason='later'))\n"
    )
    tests = "from minicalc import ops\n\ndef test_a():\n    ops.mark_all()\n    assert 0\n"
    seen = _guarded_run(tmp_path, package, tests)["tests"]
    assert isinstance(seen, dict) and seen["tests/test_x.py::test_a"] == "failed", seen


def test_a_tool_call_with_a_nul_byte_yields_an_observation() -> None:
    """NUL bytes, lone surrogates and huge arguments in every tool: an error observation each
    (marked malformed), never an exception out of env.step; the episode goes on."""
    env = SWESmithEnv(
        extras={"instance": "minicalc__clamp_off_by_one", "executor": LocalExecutor()}
    )
    try:
        env.init()
        calls = [
            "<tool>bash\necho a\0b</tool>",
            "<tool>view\nminicalc/ops.py\0</tool>",
            '<tool>create\n{"path": "a\\u0000b", "content": "x"}</tool>',
            '<tool>create\n{"path": "lone.py", "content": "\\ud800"}</tool>',
            "<tool>bash\necho \udcff</tool>",
            "<tool>bash\n" + "#" * 2_000_000 + "</tool>",
        ]
        for call in calls:
            out = env.step(call)
            text = out["observations"][0]["content"]
            assert text.startswith("error:") and out["metadata"]["malformed_tool_call"], text
            assert not out["done"]
        out = env.step("<tool>bash\necho still here</tool>")
        assert "still here" in out["observations"][0]["content"]
    finally:
        env.close()


def test_every_grader_hack_family_earns_zero_on_local() -> None:
    results = run_hacks(LocalExecutor(), HACKS_GRADER, workers=2)
    beaten = [(d["name"], d["reward"], d["reason"]) for d in results if not d["defeated"]]
    assert not beaten, beaten


def test_every_grader_hack_family_earns_zero_on_docker() -> None:
    from thundersync.sandbox.docker_backend import DockerExecutor

    results = run_hacks(DockerExecutor(), HACKS_GRADER, workers=2)
    beaten = [(d["name"], d["reward"], d["reason"]) for d in results if not d["defeated"]]
    assert not beaten, beaten
