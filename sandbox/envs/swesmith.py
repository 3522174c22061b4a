"""SWE-smith instances: loading records, building local repository mirrors, grading patches.

A record (JSON / JSONL) carries `instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS,
image_name, problem_statement`; `patch` *creates* the bug (the gold fix is its reverse). The
mirror repository has one branch per instance: the bug commit, then a commit that deletes the
FAIL_TO_PASS test files, so the agent never sees the failing tests. Grading follows swesmith:
check out the branch, restore the tests from HEAD~1, apply the model patch (git apply, then
`--reject`, then `patch --fuzz=5`), revert every test file (test edits are discarded), run the
eval script between the `>>>>> Start Test Output` / `End` markers under `set -uxo pipefail`,
parse `pytest -v` / `-rA` lines, resolved = every FAIL_TO_PASS and PASS_TO_PASS test passes.
swebench / swesmith themselves are not dependencies (they pull docker-image tooling and
dataset stacks); the parser is re-implemented and tested on their documented log format.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

from sandbox.executor import Session

START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
REQUIRED = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")


class RecordError(ValueError):
    """A malformed instance record; the message names the file, the record and the field."""


@dataclass(frozen=True)
class SweInstance:
    instance_id: str
    repo: str
    patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem_statement: str = ""
    image_name: str = ""
    source: str = ""

    @property
    def repo_name(self) -> str:
        return self.repo.rstrip("/").split("/")[-1]

    @property
    def test_files(self) -> list[str]:
        return sorted({t.split("::")[0] for t in self.fail_to_pass + self.pass_to_pass})


def _as_list(value: object, where: str, name: str) -> list[str]:
    if isinstance(value, str):  # SWE-bench style: a JSON-encoded list inside a string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RecordError(f"{where}: field {name!r} must be a list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{where}: field {name!r} must be a list of test ids (strings)")
    return list(value)


def parse_record(rec: object, where: str) -> SweInstance:
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: expected a JSON object with fields {list(REQUIRED)}")
    for key in REQUIRED:
        if key not in rec:
            raise RecordError(f"{where}: missing field {key!r} (required: {list(REQUIRED)})")
    for key in ("instance_id", "repo", "patch"):
        if not isinstance(rec[key], str) or not rec[key].strip():
            raise RecordError(f"{where}: field {key!r} must be a non-empty string")
    if "diff --git" not in rec["patch"]:
        raise RecordError(f"{where}: field 'patch' must be a unified git diff (no 'diff --git')")
    f2p = _as_list(rec["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    if not f2p:
        raise RecordError(f"{where}: field 'FAIL_TO_PASS' is empty; an instance needs >= 1 test")
    return SweInstance(
        instance_id=rec["instance_id"],
        repo=rec["repo"],
        patch=rec["patch"],
        fail_to_pass=f2p,
        pass_to_pass=_as_list(rec["PASS_TO_PASS"], where, "PASS_TO_PASS"),
        problem_statement=str(rec.get("problem_statement", "")),
        image_name=str(rec.get("image_name", "")),
        source=where,
    )


def load_instances(path: str | Path) -> list[SweInstance]:
    """Records from a .json (list or one object) or .jsonl file."""
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"{p}: no such file (expected a .json or .jsonl of SWE-smith records)")
    text = p.read_text()
    if p.suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{p}:{i}: not valid JSON ({e.msg})") from None
            out.append(parse_record(rec, f"{p}:{i}"))
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    recs = data if isinstance(data, list) else [data]
    return [parse_record(r, f"{p}[{i}]") for i, r in enumerate(recs)]


# ---- mirrors -----------------------------------------------------------------------------------
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "thundersync",
    "GIT_AUTHOR_EMAIL": "fixtures@thundersync.invalid",
    "GIT_COMMITTER_NAME": "thundersync",
    "GIT_COMMITTER_EMAIL": "fixtures@thundersync.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str, input_text: str | None = None) -> str:
    r = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", *args],
        cwd=cwd,
        env=_GIT_ENV,
        input=input_text,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RecordError(f"git {' '.join(args)} failed in {cwd}: {r.stderr.strip()}")
    return r.stdout


def build_mirror(source: Path, instances: list[SweInstance], dest: Path) -> Path:
    """A git mirror of `source` (a plain file tree) with one branch per instance (deterministic)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "Initial commit")
    for inst in instances:
        git(dest, "checkout", "-q", "-b", inst.instance_id, "main")
        git(dest, "apply", "--whitespace=nowarn", "-", input_text=inst.patch)
        git(dest, "commit", "-q", "-am", "Bug Patch")
        f2p_files = sorted({t.split("::")[0] for t in inst.fail_to_pass})
        git(dest, "rm", "-q", "--", *f2p_files)
        git(dest, "commit", "-q", "-m", "Remove F2P Tests")
        git(dest, "checkout", "-q", "main")
    return dest


def clone_instance(mirror: Path, instance_id: str, dest: Path) -> Path:
    subprocess.run(
        ["git", "clone", "-q", "--branch", instance_id, str(mirror), str(dest)],
        env=_GIT_ENV,
        check=True,
        capture_output=True,
    )
    return dest


# ---- patches -----------------------------------------------------------------------------------
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


# ---- grading -----------------------------------------------------------------------------------
class Status(StrEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


_STATUS = "|".join(s.value for s in Status)
_VERBOSE = re.compile(rf"^(\S+::\S+)\s+({_STATUS})\b")
_SUMMARY = re.compile(rf"^({_STATUS})\s+(\S+::\S+)")


def parse_pytest_log(log: str) -> dict[str, Status]:
    """Test id -> status from `pytest -v` lines and `-rA` summary lines (summary wins)."""
    if START_MARKER in log:
        log = log.split(START_MARKER, 1)[1]
    if END_MARKER in log:
        log = log.split(END_MARKER, 1)[0]
    out: dict[str, Status] = {}
    for line in log.splitlines():
        line = line.strip()
        m = _VERBOSE.match(line)
        if m:
            out[m.group(1)] = Status(m.group(2))
            continue
        m = _SUMMARY.match(line)
        if m:
            test_id = m.group(2).split(" - ")[0]
            out[test_id] = Status(m.group(1))
    return out


@dataclass
class Grade:
    resolved: bool
    reward: float
    reason: str
    f2p_failed: list[str] = field(default_factory=list)
    p2p_failed: list[str] = field(default_factory=list)
    dropped_test_edits: list[str] = field(default_factory=list)


def grade(inst: SweInstance, statuses: dict[str, Status]) -> Grade:
    good = (Status.PASSED, Status.XFAIL)
    f2p = [t for t in inst.fail_to_pass if statuses.get(t) not in good]
    p2p = [t for t in inst.pass_to_pass if statuses.get(t) not in good]
    if not f2p and not p2p:
        return Grade(True, 1.0, "resolved")
    return Grade(False, 0.0, f"tests failed: FAIL_TO_PASS {f2p}, PASS_TO_PASS {p2p}", f2p, p2p)


def eval_script(inst: SweInstance) -> str:
    files = " ".join(inst.test_files)
    return f"""#!/bin/bash
set -uxo pipefail
cd "$(dirname "$0")/.."
git checkout -q HEAD~1 -- {files}
: '{START_MARKER}'
python3 -m pytest -v -rA -p no:cacheprovider {files}
: '{END_MARKER}'
"""


APPLY = """set -u
cd "$1"
for t in $(git diff --name-only HEAD~1 HEAD); do git checkout -q HEAD~1 -- "$t"; done
if git apply --verbose /tmp/model.patch; then echo APPLIED=git_apply
elif git apply --verbose --reject /tmp/model.patch; then echo APPLIED=git_apply_reject
elif patch --batch --fuzz=5 -p1 -i /tmp/model.patch; then echo APPLIED=patch_fuzz
else echo APPLY_FAILED; exit 1; fi
"""


def evaluate(session: Session, inst: SweInstance, model_patch: str, timeout: float = 300) -> Grade:
    """Grade `model_patch` in a fresh session whose task dir is a clone of the instance branch."""
    patch, dropped = drop_test_edits(model_patch)
    session.put_file(".tsrl/eval.sh", eval_script(inst).encode())
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
    # revert test files to the instance's state (the F2P tests as in HEAD~1)
    session.exec(f"git checkout -q HEAD~1 -- {' '.join(inst.test_files)}; rm -f *.rej", timeout=60)
    r = session.exec("bash .tsrl/eval.sh 2>&1", timeout=timeout)
    if r.timed_out:
        return Grade(False, 0.0, f"timeout after {timeout}s", dropped_test_edits=dropped)
    g = grade(inst, parse_pytest_log(r.stdout))
    g.dropped_test_edits = dropped
    if not patch.strip():
        g.reason = "empty patch; " + g.reason
    if dropped:
        g.reason += f" (test edits discarded: {dropped})"
    return g
