"""Grading a SWE-smith patch as swesmith does, through channels the patch cannot write.

`evaluate(session, inst, patch)` runs in a fresh session on the squashed tree of the bug commit
(the instance's tests present, no history: `sandbox.envs.swesmith.squashed_checkout`):
- the patch filter: edits of test files (test dirs, `test_*.py`, conftest.py, pytest.ini,
  tox.ini) are discarded; a patch that changes how the tests run is refused with reward 0: a
  module or package shadowing the runner (`pytest.py`, `_pytest/`, `py.py`), `sitecustomize` /
  `usercustomize` / `.pth` files, or pytest options (`addopts`, `[tool:pytest]`,
  `[tool.pytest...]`, `-p`) in setup.cfg / pyproject.toml / tox.ini / pytest.ini / .pytest.ini;
- the patch is applied by the harness (git apply, then `--reject`, then `patch --fuzz=5`),
  every test file is restored to the instance's state, and the repo profile's test command
  (`sandbox.envs.swesmith_profiles`, pytest) writes a JUnit report to an
  unguessable path outside the repository (`sandbox.envs.junit`): test results come only from
  it, never from the output stream, so printed `PASSED <id>` lines earn nothing; a guard
  plugin loaded before collection (`sandbox.envs.pytest_guard`) must back every reported pass
  with its own verdict, so package code that patches pytest at import earns nothing either;
- reasons say what happened: "n of m FAIL_TO_PASS failed: ...", "apply failed: ...",
  "eval failed before tests ran: <tail>", "patch refused: ...", "the code under test tampered
  with the test runner: ...".
resolved = every FAIL_TO_PASS test reported passed (XFAIL counts) and no PASS_TO_PASS test failed
as swesmith counts them (`grade`: missing = passed unless its file failed to collect, skipped =
not counted).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from thundersync.sandbox.envs.junit import (
    ReportError,
    Status,
    check_runner_agrees,
    parse_junit,
    report_path,
    statuses_for,
    uncollected_files,
)
from thundersync.sandbox.envs.swesmith import END_MARKER, START_MARKER, SweInstance
from thundersync.sandbox.envs.swesmith_profiles import (
    ACTIVATE,
    GUARD_MODULE,
    RepoProfile,
    profile_for,
)
from thundersync.sandbox.executor import ExecResult, Session

REPORT_DIR = "/logs"  # a scratch dir of the eval session, outside the repository
_CONFIGS = ("setup.cfg", "pyproject.toml", "tox.ini", "pytest.ini", ".pytest.ini")
_RUNNER_OPTION = re.compile(
    r"^(?:\+(?!\+\+)|-(?!--)).*(addopts|\[tool:pytest\]|\[tool\.pytest|\bpytest\b|-p\s)", re.M
)


def is_test_path(path: str) -> bool:
    p = PurePosixPath(path)
    if any(part in ("test", "tests", "testing") for part in p.parts[:-1]):
        return True
    return (
        p.name.startswith("test_")
        or p.name.endswith("_test.py")
        or p.name in ("conftest.py", "pytest.ini", "tox.ini")
    )


def split_patch(patch: str) -> list[tuple[str, str]]:
    """[(path, file_diff)] for each `diff --git a/X b/Y` section."""
    out = []
    for chunk in re.split(r"(?m)^(?=diff --git )", patch):
        m = re.match(r"diff --git a/(\S+) b/(\S+)", chunk)
        if m:
            out.append((m.group(2), chunk))
    return out


def drop_test_edits(patch: str) -> tuple[str, list[str]]:
    kept: list[str] = []
    dropped: list[str] = []
    for path, chunk in split_patch(patch):
        if is_test_path(path):
            dropped.append(path)
        else:
            kept.append(chunk)
    return "".join(kept), dropped


def runner_edits(patch: str) -> list[str]:
    """Why the patch changes how the tests run (empty: it does not)."""
    why = []
    for path, chunk in split_patch(patch):
        p = PurePosixPath(path)
        if (
            p.name in ("pytest.py", "py.py")
            or "_pytest" in p.parts
            or p.stem == "pytest"
            or p.stem == GUARD_MODULE
            or ".tsrl" in p.parts
        ):
            why.append(f"{path} shadows the test runner")
        elif p.stem in ("sitecustomize", "usercustomize") or p.suffix == ".pth":
            why.append(f"{path} runs code at interpreter start")
        elif p.name in _CONFIGS and _RUNNER_OPTION.search(chunk):
            why.append(f"{path} changes pytest options")
    return why


@dataclass
class Grade:
    resolved: bool
    reward: float
    reason: str
    f2p_failed: list[str] = field(default_factory=list)
    p2p_failed: list[str] = field(default_factory=list)
    dropped_test_edits: list[str] = field(default_factory=list)


def _failed_list(kind: str, failed: list[str], total: int) -> str:
    shown = ", ".join(failed[:5]) + (f", ... ({len(failed) - 5} more)" if len(failed) > 5 else "")
    return f"{len(failed)} of {total} {kind} failed: {shown}"


def grade(
    inst: SweInstance, statuses: dict[str, Status], broken_files: frozenset[str] = frozenset()
) -> Grade:
    """swesmith's `get_eval_tests_report` for PASS_TO_PASS: a test missing from the report counts
    as passed (swesmith may run a subset of the suite) and a skipped one counts neither way;
    except that a missing test whose file failed to collect (`broken_files`) failed. Stricter
    than swesmith for FAIL_TO_PASS: every one must be reported passed (or xfail), because a
    policy could otherwise make the hidden tests vanish (an import-time `pytest.skip`, a module
    that no longer imports) and be "resolved" without fixing anything."""
    good = (Status.PASSED, Status.XFAIL)
    f2p = [t for t in inst.fail_to_pass if statuses.get(t) not in good]

    def p2p_failed(t: str) -> bool:
        st = statuses.get(t)
        if st is None:
            return t.split("::")[0] in broken_files
        return st not in (*good, Status.SKIPPED)

    p2p = [t for t in inst.pass_to_pass if p2p_failed(t)]
    if not f2p and not p2p:
        return Grade(True, 1.0, "resolved")
    parts = [_failed_list("FAIL_TO_PASS", f2p, len(inst.fail_to_pass))] if f2p else []
    if p2p:
        parts.append(_failed_list("PASS_TO_PASS", p2p, len(inst.pass_to_pass)))
    return Grade(False, 0.0, "; ".join(parts), f2p, p2p)


GUARD_SOURCE = (Path(__file__).with_name("pytest_guard.py")).read_bytes()


def guard_findings(guard: bytes | None, statuses: dict[str, Status]) -> list[str]:
    """Why the guard plugin's own verdict does not back the report (empty: it does): no verdict
    at all, tampering it saw, or a graded test the report has passed that the guard saw fail or
    never saw run."""
    if guard is None:
        return ["the guard plugin wrote no verdict (the run did not finish as pytest does)"]
    try:
        data = json.loads(guard)
        seen, found = dict(data["tests"]), [str(x) for x in data["tampered"]]
    except (ValueError, KeyError, TypeError):
        return ["the guard plugin's verdict is not its own (unreadable)"]
    for t, st in statuses.items():
        if st is Status.PASSED and seen.get(t) != "passed":
            found.append(f"{t} reported passed, but the guard saw it {seen.get(t) or 'not run'}")
    return found


def eval_script(inst: SweInstance, report: str, profile: RepoProfile | None = None) -> str:
    """The repo's profile test command on the instance's test files, in the image's Python
    environment when it has one (SWE-smith's conda env `testbed`)."""
    profile = profile or profile_for(inst)
    files = " ".join(shlex.quote(f) for f in inst.test_files)
    guard_dir = shlex.quote(report.rsplit("/", 1)[0])
    guard = (
        f"export PYTHONPATH={guard_dir}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"TSRL_GUARD_OUT={guard_dir}/guard.json"
        if profile.is_pytest
        else "# no guard plugin: the runner is not pytest"
    )
    return f"""#!/bin/bash
set -uxo pipefail
cd "$(dirname "$0")/.."
git checkout -q HEAD -- {files}
{ACTIVATE}
{guard}
: '{START_MARKER}'
{profile.command(inst.test_files, report)}
rc=$?
: '{END_MARKER}'
exit $rc
"""


APPLY = """set -u
cd "$1"
if git apply --verbose /tmp/model.patch; then echo APPLIED=git_apply
elif git apply --verbose --reject /tmp/model.patch; then echo APPLIED=git_apply_reject
elif patch --batch --fuzz=5 -p1 -i /tmp/model.patch; then echo APPLIED=patch_fuzz
else echo APPLY_FAILED; exit 1; fi
"""


def _tail(r: ExecResult, n: int = 600) -> str:
    text = (r.stdout + r.stderr).strip()
    if START_MARKER in text:
        text = text.split(START_MARKER, 1)[1]
    return ("..." + text[-n:]) if len(text) > n else text


def evaluate(session: Session, inst: SweInstance, model_patch: str, timeout: float = 300) -> Grade:
    """Grade `model_patch` in a fresh session on the instance's squashed bug tree."""
    refused = runner_edits(model_patch)
    if refused:
        return Grade(False, 0.0, f"patch refused: {'; '.join(refused)}")
    patch, dropped = drop_test_edits(model_patch)
    report = report_path(REPORT_DIR)
    profile = profile_for(inst)
    session.put_file(".tsrl/eval.sh", eval_script(inst, report, profile).encode())
    if patch.strip():
        session.put_file(".tsrl/model.patch", patch.encode())
        session.put_file(".tsrl/apply.sh", APPLY.encode())
        r = session.exec(
            f"cp .tsrl/model.patch /tmp/model.patch && bash .tsrl/apply.sh {session.workdir_inside} 2>&1",
            timeout=120,
        )
        if r.timed_out or r.exit_code != 0:
            tail = r.stdout.strip()[-300:]
            return Grade(False, 0.0, f"apply failed: {tail}", dropped_test_edits=dropped)
    guard_dir = report.rsplit("/", 1)[0]
    if profile.is_pytest:
        session.put_file(f"{guard_dir}/{GUARD_MODULE}.py", GUARD_SOURCE)
    # the instance's test files as they are in its bug commit (test edits never survive)
    files = " ".join(shlex.quote(f) for f in inst.test_files)
    session.exec(f"git checkout -q HEAD -- {files}; rm -f *.rej", timeout=60)
    r = session.exec("bash .tsrl/eval.sh 2>&1", timeout=timeout)
    if r.timed_out:
        return Grade(False, 0.0, f"timeout after {timeout}s", dropped_test_edits=dropped)
    data = session.get_file(report)
    guard = session.get_file(f"{guard_dir}/guard.json") if profile.is_pytest else None
    session.exec(f"rm -rf {shlex.quote(guard_dir)}", timeout=60)
    try:
        if data is None:
            raise ReportError("no test report")
        parsed = parse_junit(data)
    except ReportError as e:
        return Grade(
            False,
            0.0,
            f"eval failed before tests ran ({e}): {_tail(r)}",
            dropped_test_edits=dropped,
        )
    try:
        check_runner_agrees(parsed, r.exit_code, "the test command")
    except ReportError as e:
        return Grade(False, 0.0, f"{e}: {_tail(r)}", dropped_test_edits=dropped)
    ids = inst.fail_to_pass + inst.pass_to_pass
    statuses = statuses_for(ids, parsed)
    tampered = guard_findings(guard, statuses) if profile.is_pytest else []
    if tampered:
        why = "; ".join(tampered[:3]) + (
            f" (+{len(tampered) - 3} more)" if len(tampered) > 3 else ""
        )
        return Grade(
            False,
            0.0,
            f"the code under test tampered with the test runner: {why}",
            dropped_test_edits=dropped,
        )
    g = grade(inst, statuses, uncollected_files(parsed, inst.test_files))
    g.dropped_test_edits = dropped
    if not patch.strip():
        g.reason = "empty patch; " + g.reason
    if dropped:
        g.reason += f" (test edits discarded: {dropped})"
    return g
