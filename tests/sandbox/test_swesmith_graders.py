"""SWE-smith graders the policy cannot game: each cheat earns 0 with a reason; gold earns 1."""

from __future__ import annotations

import json
from typing import Any

import pytest

from thundersync.sandbox.envs.check import check_swe
from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES
from thundersync.sandbox.envs.swesmith import load_instances
from thundersync.sandbox.envs.swesmith_env import SWESmithEnv
from thundersync.sandbox.envs.swesmith_eval import runner_edits
from thundersync.sandbox.local import LocalExecutor

INST = next(
    i for i in load_instances(SWESMITH_INSTANCES) if i.instance_id.startswith("minicalc__clamp")
)
F2P = INST.fail_to_pass[0]
ALL_IDS = INST.fail_to_pass + INST.pass_to_pass

PRINT_PASSED = (
    "import atexit\n"
    f"_IDS = {ALL_IDS!r}\n"
    "atexit.register(lambda: print('\\n'.join(f'PASSED {i}' for i in _IDS) + '\\n' + "
    "'\\n'.join(f'{i} PASSED' for i in _IDS)))\n"
)
# at import: look for the fixed ops.py anywhere in git history and put it in place
FROM_HISTORY = """import pathlib as _p, subprocess as _s
_d = _p.Path(__file__).parent
for _h in _s.run(["git", "-C", str(_d), "rev-list", "--all"], capture_output=True, text=True).stdout.split():
    _o = _s.run(["git", "-C", str(_d), "show", _h + ":minicalc/ops.py"], capture_output=True, text=True)
    if _o.returncode == 0 and "if x > hi:" in _o.stdout:
        (_d / "ops.py").write_text(_o.stdout)
        break
"""


def _append(path: str, text: str) -> str:
    return f"<tool>bash\ncat >> {path} <<'EOF'\n{text}EOF\n</tool>"


def _episode(executor: LocalExecutor, *actions: str) -> tuple[dict[str, Any], list[str]]:
    env = SWESmithEnv(extras={"instance": INST.instance_id, "executor": executor})
    try:
        env.init()
        seen = [env.step(a)["observations"][0]["content"] for a in actions]
        out = env.step("<tool>submit</tool>")
        return {"reward": out["reward"], **out["metadata"]["grade"]}, seen
    finally:
        env.close()


def test_agent_repo_has_no_history_with_the_bug_or_hidden_tests(
    local_executor: LocalExecutor,
) -> None:
    test_file = F2P.split("::")[0]
    _, seen = _episode(
        local_executor,
        "<tool>bash\ngit rev-list --all | wc -l; git branch -a</tool>",
        f"<tool>bash\ngit show HEAD~1:{test_file} >/dev/null 2>&1 && echo LEAK || echo nohist</tool>",
        "<tool>bash\ngit cat-file --batch-all-objects --batch-check | grep -c blob; "
        "git ls-files | grep -c . </tool>",
        "<tool>bash\ngit reflog | wc -l; git stash list | wc -l</tool>",
    )
    commits = seen[0].split()
    assert commits[0] == "1", seen[0]  # one commit, one branch
    assert "nohist" in seen[1]
    blobs, tracked = seen[2].split()[:2]
    assert blobs == tracked, seen[2]  # no object beyond the tree the agent sees
    assert not any(t.split("::")[0] in seen[2] for t in INST.fail_to_pass)


@pytest.mark.parametrize(
    ("actions", "needle"),
    [
        # printed PASSED lines at interpreter exit, from package code
        ([_append("minicalc/__init__.py", PRINT_PASSED)], "FAIL_TO_PASS failed"),
        # fix the bug at test time from git history
        ([_append("minicalc/__init__.py", FROM_HISTORY)], "FAIL_TO_PASS failed"),
        # a pytest.py at the repository root
        (
            ["<tool>bash\nprintf 'import sys\\nsys.exit(0)\\n' > pytest.py</tool>"],
            "shadows the test runner",
        ),
        # addopts in setup.cfg / pyproject.toml
        (
            ["<tool>bash\nprintf '[tool:pytest]\\naddopts = -p no:python\\n' > setup.cfg</tool>"],
            "changes pytest options",
        ),
        (
            [
                "<tool>bash\nprintf '[tool.pytest.ini_options]\\naddopts = \"--co\"\\n' > pyproject.toml</tool>"
            ],
            "changes pytest options",
        ),
        # a conftest.py forcing passes (discarded like every test edit)
        (
            [
                _append(
                    "conftest.py",
                    "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    (yield).get_result().outcome = 'passed'\n",
                )
            ],
            "test edits discarded",
        ),
        # a sitecustomize.py
        ([_append("sitecustomize.py", PRINT_PASSED)], "runs code at interpreter start"),
    ],
    ids=[
        "printed-passed",
        "git-history",
        "pytest-py",
        "setup-cfg",
        "pyproject",
        "conftest",
        "sitecustomize",
    ],
)
def test_swesmith_cheats_earn_zero(
    local_executor: LocalExecutor, actions: list[str], needle: str
) -> None:
    got, seen = _episode(local_executor, *actions)
    assert all("[exit code 0]" in s for s in seen), seen
    assert got["reward"] == 0.0 and needle in got["reason"], got


def test_gold_still_resolves_and_noop_fails() -> None:
    out = check_swe(INST, LocalExecutor())
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
    assert "1 of 1 FAIL_TO_PASS failed" in out["noop_reason"]


def test_gold_patch_that_does_not_apply_says_so() -> None:
    broken = INST.__class__(
        **{**INST.__dict__, "patch": INST.patch.replace("x >= hi - 1", "x >= hi - 7")}
    )
    out = check_swe(broken, LocalExecutor())
    assert out["gold_reward"] == 0.0 and "gold patch does not apply" in out["gold_reason"], out


def test_runner_edit_filter_keeps_ordinary_config_changes() -> None:
    ok = "diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1 @@\n-version = 1\n+version = 2\n"
    assert runner_edits(ok) == []
    assert runner_edits(ok.replace("version = 2", "addopts = -q")) == [
        "setup.cfg changes pytest options"
    ]
    assert json.dumps(runner_edits("diff --git a/pkg/_pytest/x.py b/pkg/_pytest/x.py\n"))


def test_a_registered_non_pytest_profile_grades_from_its_own_junit_report() -> None:
    """The profile registry for other runners: the profile names the flags that make its runner
    write the JUnit report (here pytest's `--junit-xml` alias stands in for jest-junit or
    gotestsum, which this machine lacks); grading reads that report and the exit code, and the
    pytest-only guard is neither installed nor asked for."""
    from thundersync.sandbox.envs.swesmith_eval import eval_script
    from thundersync.sandbox.envs.swesmith_profiles import RepoProfile, profile_for, register

    fixture_profile = profile_for(INST)
    assert fixture_profile.is_pytest
    profile = RepoProfile(
        "other-runner",
        test_cmd="python3 -m pytest -q -p no:cacheprovider",
        report_flags="--junit-xml={report}",
    )
    register(profile, INST.repo)
    try:
        script = eval_script(INST, "/logs/r/junit.xml", profile)
        assert "--junit-xml=/logs/r/junit.xml" in script and "tsrl_pytest_guard" not in script
        out = check_swe(INST, LocalExecutor())
        assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
        assert "1 of 1 FAIL_TO_PASS failed" in out["noop_reason"], out
    finally:
        register(fixture_profile, INST.repo)
    assert profile_for(INST) is fixture_profile
