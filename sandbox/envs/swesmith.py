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
Instance images (SWE-smith's published layout: the clean repo at /testbed, its environment
installed): `export_image_dir` copies the image's repo (no .git) out of a never-started
container, and `instance_tree` turns it into the same one-commit trees (bug applied; the agent's
without the FAIL_TO_PASS files), so an image's history cannot leak the bug either.
swebench / swesmith themselves are not dependencies (they pull docker-image tooling and
dataset stacks); the parser is re-implemented and tested on their documented log format.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from thundersync.sandbox.envs.junit import Status

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
    repos_dir: str = ""  # where this record's mirror lives (`tsrl data import --repos-dir`)

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
    statement = rec.get("problem_statement", "")
    if not isinstance(statement, str):  # null would become the prompt "None"
        raise RecordError(
            f"{where}: field 'problem_statement' must be the issue text (a string), got "
            f"{json.dumps(statement)[:40]}; give the text, or leave the field out (the prompt "
            "is then a generic 'Fix the failing behaviour.')"
        )
    image = rec.get("image_name") or ""
    if not isinstance(image, str):
        raise RecordError(f"{where}: field 'image_name' must be an image name (a string)")
    return SweInstance(
        instance_id=rec["instance_id"],
        repo=rec["repo"],
        patch=rec["patch"],
        fail_to_pass=f2p,
        pass_to_pass=_as_list(rec["PASS_TO_PASS"], where, "PASS_TO_PASS"),
        problem_statement=statement,
        image_name=image,
        source=where,
        repos_dir=str(rec.get("repos_dir") or ""),
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


# ---- instance images ---------------------------------------------------------------------------
class ImageMissing(RecordError):
    """The record's image is not on this machine (nothing is pulled from the network)."""


def require_image(client: Any, inst: SweInstance) -> Any:
    """The docker SDK image of `inst.image_name` (through the image map, `sandbox.images`), or
    `ImageMissing` naming the image, the map option and the fix."""
    from thundersync.sandbox.images import ImageBuildError, ensure_present

    what = f"{inst.source}: instance {inst.instance_id!r} needs image"
    try:
        ensure_present(client, inst.image_name, what)
    except ImageBuildError as e:
        raise ImageMissing(
            f"{e}; or build it (swesmith's profile build_image, `docker build -t "
            f"{inst.image_name} ...`)"
        ) from None
    return client.images.get(inst.image_name)


def _skip_unsafe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:  # links out of the tree, devices: dropped rather than failing the whole export
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


@contextlib.contextmanager
def _created(client: Any, image: str) -> Iterator[Any]:
    """A created, never started container of `image`: its filesystem is read, nothing runs."""
    from thundersync.sandbox.docker_support import owner_labels

    labels = {"thundersync.sandbox": "1", **owner_labels(), "thundersync.label": "swe-export"}
    ct = client.containers.create(image, ["true"], network_mode="none", labels=labels)
    try:
        yield ct
    finally:
        ct.remove(force=True)


def export_image_dir(client: Any, image: str, path: str, dest: Path) -> bool:
    """Copy `path` of `image` (its files, no `.git`) to `dest`; False when the image lacks it."""
    import docker.errors

    with _created(client, image) as ct:
        try:
            stream, _ = ct.get_archive(path)
        except docker.errors.NotFound:
            return False
        prefix = PurePosixPath(path).name + "/"
        with tempfile.TemporaryFile() as spool:  # repositories can be large: not in memory
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool) as tar:
                members = []
                for m in tar:
                    rel = m.name[len(prefix) :] if m.name.startswith(prefix) else ""
                    if rel and rel != ".git" and not rel.startswith(".git/"):
                        m.name = rel
                        members.append(m)
                dest.mkdir(parents=True, exist_ok=True)
                tar.extractall(dest, members=members, filter=_skip_unsafe)
    return True


def image_has(client: Any, image: str, path: str) -> bool:
    import docker.errors

    with _created(client, image) as ct:
        try:
            ct.get_archive(path)[0].close()
        except docker.errors.NotFound:
            return False
    return True


def instance_tree(base: Path, inst: SweInstance, dest: Path, *, hide_tests: bool) -> Path:
    """`base` (the image's clean repo) with the bug applied, as ONE commit of a fresh
    repository; `hide_tests` also removes the FAIL_TO_PASS test files (the agent's tree)."""
    shutil.copytree(base, dest, symlinks=True)
    git(dest, "init", "-q")
    try:
        git(dest, "apply", "--whitespace=nowarn", "-", input_text=inst.patch)
    except RecordError as e:
        raise RecordError(
            f"{inst.source}: the patch of {inst.instance_id!r} does not apply to the repo in "
            f"image {inst.image_name!r} ({e}); is image_name the image of this repo/commit?"
        ) from None
    if hide_tests:
        for f in sorted({t.split("::")[0] for t in inst.fail_to_pass}):
            (dest / f).unlink(missing_ok=True)
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
