from __future__ import annotations

import json
from pathlib import Path

import pytest
import skyrl_gym

import thundersync.sandbox.envs  # noqa: F401  (registers the envs)
from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES
from thundersync.sandbox.envs.junit import parse_junit, uncollected_files
from thundersync.sandbox.envs.swesmith import RecordError, Status, load_instances, parse_pytest_log
from thundersync.sandbox.envs.swesmith_eval import drop_test_edits, grade

# A log in the format swebench's pytest parser documents: -v lines plus the -rA summary.
LOG = """+ : '>>>>> Start Test Output'
============================= test session starts ==============================
tests/test_ops.py::test_add PASSED                                       [ 20%]
tests/test_ops.py::test_clamp_bounds FAILED                              [ 40%]
tests/test_ops.py::test_power SKIPPED (no reason)                        [ 60%]
=========================== short test summary info ============================
PASSED tests/test_ops.py::test_add
FAILED tests/test_ops.py::test_clamp_bounds - assert 9 == 10
ERROR tests/test_stats.py::test_mean
+ : '>>>>> End Test Output'
PASSED tests/outside_markers.py::test_x
"""


def test_pytest_log_parser_reads_verbose_and_summary_lines_between_markers() -> None:
    st = parse_pytest_log(LOG)
    assert st == {
        "tests/test_ops.py::test_add": Status.PASSED,
        "tests/test_ops.py::test_clamp_bounds": Status.FAILED,
        "tests/test_ops.py::test_power": Status.SKIPPED,
        "tests/test_stats.py::test_mean": Status.ERROR,
    }


def test_resolved_needs_every_f2p_and_p2p_test_passing() -> None:
    inst = load_instances(SWESMITH_INSTANCES)[0]
    all_pass = {t: Status.PASSED for t in inst.fail_to_pass + inst.pass_to_pass}
    assert grade(inst, all_pass).resolved
    broken_p2p = dict(all_pass, **{inst.pass_to_pass[0]: Status.FAILED})
    g = grade(inst, broken_p2p)
    assert not g.resolved and g.p2p_failed == [inst.pass_to_pass[0]]
    missing = {t: Status.PASSED for t in inst.pass_to_pass}
    assert grade(inst, missing).f2p_failed == inst.fail_to_pass


def test_p2p_missing_or_skipped_as_swesmith_counts_them_f2p_strictly() -> None:
    inst = load_instances(SWESMITH_INSTANCES)[0]
    all_pass = {t: Status.PASSED for t in inst.fail_to_pass + inst.pass_to_pass}
    p0, p1 = inst.pass_to_pass[:2]
    # swesmith: a PASS_TO_PASS test missing from the report passed, a skipped one is not counted
    lenient = {t: s for t, s in all_pass.items() if t != p0} | {p1: Status.SKIPPED}
    assert grade(inst, lenient).resolved
    # ... unless its file failed to collect: then it failed
    g = grade(inst, lenient, frozenset({p0.split("::")[0]}))
    assert not g.resolved and g.p2p_failed == [p0], g
    # FAIL_TO_PASS skipped or missing never resolves (a policy could make the hidden tests vanish)
    f0 = inst.fail_to_pass[0]
    for st in (Status.SKIPPED, None):
        sm = {t: s for t, s in all_pass.items() if t != f0} | ({f0: st} if st else {})
        g = grade(inst, sm)
        assert not g.resolved and g.f2p_failed == [f0] and "1 of 1 FAIL_TO_PASS" in g.reason


def test_collection_errors_name_their_files() -> None:
    xml = (
        b'<testsuites><testsuite><testcase classname="" name="tests.test_ops">'
        b'<error message="collection failure">ImportError</error></testcase>'
        b'<testcase classname="tests.test_stats" name="test_mean"/></testsuite></testsuites>'
    )
    files = ["tests/test_ops.py", "tests/test_stats.py"]
    assert uncollected_files(parse_junit(xml), files) == {"tests/test_ops.py"}


def test_patches_that_edit_tests_lose_those_files() -> None:
    patch = (
        "diff --git a/pkg/x.py b/pkg/x.py\n--- a/pkg/x.py\n+++ b/pkg/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n"
        "@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n"
    )
    kept, dropped = drop_test_edits(patch)
    assert "pkg/x.py" in kept and "test_x" not in kept
    assert dropped == ["tests/test_x.py", "conftest.py"]


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ("[1, 2]", "expected a JSON object"),
        (
            '{"instance_id": "a", "repo": "r", "patch": "diff --git a/x b/x", "FAIL_TO_PASS": []}',
            "PASS_TO_PASS",
        ),
        (
            '{"instance_id": "a", "repo": "r", "patch": "nope", "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": []}',
            "'patch'",
        ),
        (
            '{"instance_id": "a", "repo": "r", "patch": "diff --git a/x b/x", "FAIL_TO_PASS": 3, "PASS_TO_PASS": []}',
            "'FAIL_TO_PASS'",
        ),
        ("{not json", "not valid JSON"),
    ],
)
def test_malformed_records_name_file_line_and_field(
    tmp_path: Path, record: str, needle: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(record + "\n")
    with pytest.raises(RecordError) as e:
        load_instances(path)
    assert str(path) in str(e.value) and ":1" in str(e.value) and needle in str(e.value)


def test_env_rewards_gold_fix_and_rejects_test_edits_and_noop() -> None:
    inst = load_instances(SWESMITH_INSTANCES)[0]
    env = skyrl_gym.make("tsrl-swesmith", extras={"instance": inst.instance_id})
    try:
        env.init([])
        env.step(
            "<tool>create\n" + json.dumps({"path": "gold.patch", "content": inst.patch}) + "</tool>"
        )
        out = env.step("<tool>bash\ngit apply -R gold.patch && rm gold.patch</tool>")
        assert "[exit code 0]" in out["observations"][0]["content"]
        done = env.step("<tool>submit</tool>")
        assert done["done"] and done["reward"] == 1.0, done["metadata"]

        env.init([])  # cheating: delete the failing assertion's file instead of fixing the code
        test_file = inst.fail_to_pass[0].split("::")[0]
        env.step(f"<tool>bash\nmkdir -p tests && echo 'def test_ok(): pass' > {test_file}</tool>")
        cheat = env.step("<tool>submit</tool>")
        assert (
            cheat["reward"] == 0.0 and test_file in cheat["metadata"]["grade"]["dropped_test_edits"]
        )

        env.init([])
        bad = env.step("I think the fix is obvious")
        assert not bad["done"] and bad["observations"][0]["content"].startswith("error:")
        noop = env.step("<tool>submit</tool>")
        assert noop["reward"] == 0.0 and "FAIL_TO_PASS" in noop["metadata"]["grade"]["reason"]
    finally:
        env.close()
