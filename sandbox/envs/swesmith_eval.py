"""Grading a SWE-smith patch as swesmith does, through channels the patch cannot write.

`evaluate(session, inst, patch)` runs in a fresh session on the squashed tree of the bug commit
(the instance's tests present, no history: `sandbox.envs.swesmith.squashed_checkout`):
- the patch filter: edits of test files (test dirs, `test_*.py`, conftest.py, pytest.ini,
  tox.ini) are discarded; a patch that changes how the tests run is refused with reward 0: a
  module or package shadowing the runner (`pytest.py`, `_pytest/`, `py.py`), `sitecustomize` /
  `usercustomize` / `.pth` files, or pytest options (`addopts`, `[tool:pytest]`,
  `[tool.pytest...]`, `-p`) in setup.cfg / pyproject.toml / tox.ini / pytest.ini / .pytest.ini;
- a patch naming a path under `.git` (or `.gitattributes`, `.gitmodules`) in any header is
  refused; every git the grader runs reads none of the repository's configuration, hooks or
  attributes drivers (`sandbox.envs.grader_git`);
- the patch is applied by the harness (git apply, then `--reject`, then `patch --fuzz=5`, with
  the tree's `.git` moved out of reach), every test file is restored to the instance's state,
  and the repo profile's test command
  (`sandbox.envs.swesmith_profiles`, pytest) writes a JUnit report to an
  unguessable path outside the repository (`sandbox.envs.junit`): test results come only from
  it, never from the output stream, so printed `PASSED <id>` lines earn nothing; a guard
  plugin (`sandbox.envs.pytest_guard`) must back every reported pass, xfail and skip with its
  own verdict, so package code that patches pytest at import, or calls `pytest.xfail()` /
  `pytest.skip()`, earns nothing either. pytest starts from a launcher beside the guard, so the
  guard is imported before pytest and before any repository module (the repository is put on
  `sys.path` only then, where `python -m pytest` has it);
- the scripts run from memory (`bash -c`), never from a file the code under test could rewrite
  while bash is reading it;
- reasons say what happened: "n of m FAIL_TO_PASS failed: ...", "apply failed: ...",
  "eval failed before tests ran: <tail>", "patch refused: ...", "the code under test tampered
  with the test runner: ...".
resolved = every FAIL_TO_PASS test reported passed (XFAIL counts) and no PASS_TO_PASS test failed
as swesmith counts them (`grade`: missing = passed unless its file failed to collect, skipped =
not counted); an XFAIL, XPASS or skip counts only where the guard saw the instance's own tests
(a marker, or a `pytest.skip` / `xfail` call in a test file, conftest or installed package)
decide it, anything else is a failure.
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from thundersync.sandbox.envs.grader_git import APPLY, SAFE_GIT, git_paths
from thundersync.sandbox.envs.guard_verdict import guard_backed, guard_findings
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
    why += [f"{h!r} names git's own files" for h in git_paths(patch)]
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
LAUNCHER = "tsrl_run_pytest"
# pytest's entry: the guard is imported first, from the root-only report dir (sys.path[0]), then
# pytest; the repository goes on sys.path only then (first, as `python -m pytest` has it)
LAUNCHER_SOURCE = f"""import os, sys
import {GUARD_MODULE} as guard
_key = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tsrl_key")
with open(_key, "rb") as f:
    guard.set_key(f.read())
os.unlink(_key)
import pytest
if os.environ.pop("TSRL_CWD_FIRST", "") == "1":
    sys.path.insert(0, os.getcwd())
sys.exit(pytest.main(sys.argv[1:], plugins=[guard]))
""".encode()
_PYTEST_HEAD = re.compile(r"^\s*(?:(?P<py>python[0-9.]*)\s+-m\s+pytest|pytest|py\.test)(?=\s|$)")


def test_command(profile: RepoProfile, files: list[str], report: str) -> str:
    """The profile's test command; for pytest through the launcher beside the guard."""
    cmd = profile.command(files, report)
    guard_dir = shlex.quote(report.rsplit("/", 1)[0])
    m = _PYTEST_HEAD.match(cmd) if profile.is_pytest else None
    if m is None:
        return cmd
    launch = f"{guard_dir}/{LAUNCHER}.py"
    head = f"TSRL_CWD_FIRST=1 {m['py']} {launch}" if m["py"] else f"python3 {launch}"
    return head + cmd[m.end() :]


def eval_script(
    inst: SweInstance, report: str, profile: RepoProfile | None = None, workdir: str = "."
) -> str:
    """The repo's profile test command on the instance's test files, in the image's Python
    environment when it has one (SWE-smith's conda env `testbed`). Run from memory (`bash -c`):
    a file the code under test can write would be read on by bash after its edit."""
    profile = profile or profile_for(inst)
    files = " ".join(shlex.quote(f) for f in inst.test_files)
    guard_dir = shlex.quote(report.rsplit("/", 1)[0])
    guard = (
        f"export PYTHONPATH={guard_dir}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"TSRL_GUARD_OUT={guard_dir}/guard.json"
        if profile.is_pytest
        else "# no guard plugin: the runner is not pytest"
    )
    return f"""exec 2>&1
set -uxo pipefail
cd {shlex.quote(workdir)}
{SAFE_GIT} checkout -q HEAD -- {files}
{ACTIVATE}
{guard}
: '{START_MARKER}'
{test_command(profile, inst.test_files, report)}
rc=$?
: '{END_MARKER}'
exit $rc
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
    key = secrets.token_hex(32).encode()  # signs the guard's verdict (pytest_guard.set_key)
    workdir = str(session.workdir_inside)
    if patch.strip():
        session.put_file(".tsrl/model.patch", patch.encode())
        r = session.exec(
            "cp .tsrl/model.patch /tmp/model.patch && rm -rf .tsrl && "
            f"bash -c {shlex.quote(APPLY)} apply {shlex.quote(workdir)} /tmp/model.patch 2>&1",
            timeout=120,
        )
        if r.timed_out or r.exit_code != 0:
            tail = r.stdout.strip()[-300:]
            return Grade(False, 0.0, f"apply failed: {tail}", dropped_test_edits=dropped)
    guard_dir = report.rsplit("/", 1)[0]
    if profile.is_pytest:
        session.put_file(f"{guard_dir}/{GUARD_MODULE}.py", GUARD_SOURCE)
        session.put_file(f"{guard_dir}/{LAUNCHER}.py", LAUNCHER_SOURCE)
        session.put_file(f"{guard_dir}/tsrl_key", key)
    # the instance's test files as they are in its bug commit (test edits never survive)
    files = " ".join(shlex.quote(f) for f in inst.test_files)
    session.exec(f"{SAFE_GIT} checkout -q HEAD -- {files}; rm -f *.rej", timeout=60)
    r = session.exec(eval_script(inst, report, profile, workdir), timeout=timeout)
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
    notes: list[str] = []
    tampered = guard_findings(guard, statuses, key) if profile.is_pytest else []
    if profile.is_pytest:
        statuses, notes = guard_backed(guard, statuses, key)
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
    if notes and not g.resolved:
        g.reason += " (not outcomes the instance's tests expect: " + "; ".join(notes[:3]) + ")"
    return g
