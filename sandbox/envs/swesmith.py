"""SWE-smith instances: loading records, building local repository mirrors, grading patches.

A record (JSON / JSONL) carries `instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS,
image_name, problem_statement`; `patch` *creates* the bug (the gold fix is its reverse). The
mirror repository has one branch per instance: the bug commit, then a commit that deletes the
FAIL_TO_PASS test files. Episodes never see that history: the agent works on
`squashed_checkout(mirror, instance_id)` (the branch's tree as the one commit of a fresh
repository) and grading runs on the squashed tree of `instance_id~1` (the bug with its tests),
so neither `git show HEAD~1:...` nor `git apply -R` of the bug diff is possible. Grading
(`sandbox.envs.swesmith_eval`) reads a JUnit report, never lines of the output;
`parse_pytest_log` stays for logs of other harnesses.
swebench / swesmith themselves are not dependencies (they pull docker-image tooling and
dataset stacks); the parser is re-implemented and tested on their documented log format.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandbox.envs.junit import Status

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


def squashed_checkout(mirror: Path, ref: str, dest: Path) -> Path:
    """`ref`'s tree of `mirror` as a fresh repository with ONE commit: no history, no other
    branch, no object that shows the bug diff or the tests removed from the agent's tree."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref],
        cwd=mirror,
        env=_GIT_ENV,
        capture_output=True,
    )
    if archive.returncode != 0:
        raise RecordError(f"git archive {ref} failed in {mirror}: {archive.stderr.decode()[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--allow-empty", "-m", "Initial commit")
    return dest


def clone_instance(mirror: Path, instance_id: str, dest: Path) -> Path:
    subprocess.run(
        ["git", "clone", "-q", "--branch", instance_id, str(mirror), str(dest)],
        env=_GIT_ENV,
        check=True,
        capture_output=True,
    )
    return dest


# ---- logs of other harnesses ------------------------------------------------------------------
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
