"""Repository profiles: how one SWE-smith repository is installed and tested.

SWE-smith keeps a profile per repository (`swesmith/profiles/`): install commands, a test
command and a log parser, plus one fixed image layout shared by every Python profile: the repo
at `/testbed`, its environment the conda env `testbed` under `/opt/miniconda3`. `profile_for`
looks a record up by its `repo` (`swesmith/owner__repo.commit8`, the mirror name, or
`owner/repo`) and falls back to `DEFAULT`, a plain pytest profile. Grading keeps reading a JUnit
report (`report_args`); `log_parser` is for logs of harnesses that give no report.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from thundersync.sandbox.envs.junit import Status
from thundersync.sandbox.envs.swesmith import SweInstance, parse_pytest_log

# the published image layout (swesmith.constants: ENV_NAME, DOCKER_WORKDIR)
IMAGE_REPO_DIR = "/testbed"
CONDA_ROOT = "/opt/miniconda3"
CONDA_ENV = "testbed"
CONDA_ENV_BIN = f"{CONDA_ROOT}/envs/{CONDA_ENV}/bin"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the image's Python environment when it has one; a no-op on images without conda (base image)
ACTIVATE = (
    f"if [ -f {CONDA_ROOT}/bin/activate ]; then "
    f"source {CONDA_ROOT}/bin/activate && conda activate {CONDA_ENV}; fi"
)

GUARD_MODULE = "tsrl_pytest_guard"  # sandbox/envs/pytest_guard.py, as the grader installs it
LogParser = Callable[[str], dict[str, Status]]


@dataclass(frozen=True)
class RepoProfile:
    """`test_cmd` is given the report flags and the instance's test files; `install_cmds` run in
    the repo when an instance image is built (published images ran them). `report_flags` is
    None for pytest (JUnit report, no cache writes, the grader's guard plugin); another runner
    names the flags that make it write a JUnit report at `{report}` (jest with jest-junit,
    gotestsum's `--junitfile {report}`, ...): grading then trusts that report and the runner's
    exit code, without the pytest-only guard."""

    name: str
    test_cmd: str = "python3 -m pytest -rA --color=no --disable-warnings"
    install_cmds: tuple[str, ...] = ("python -m pip install -e .",)
    log_parser: LogParser = parse_pytest_log
    report_flags: str | None = None

    @property
    def is_pytest(self) -> bool:
        return self.report_flags is None

    def report_args(self, report: str) -> str:
        """The runner's flags that write the JUnit report grading reads (pytest: no cache
        writes, and the grader's guard plugin `sandbox.envs.pytest_guard`, beside the report)."""
        if self.report_flags is not None:
            return self.report_flags.format(report=shlex.quote(report))
        return f"-p no:cacheprovider -p {GUARD_MODULE} --junitxml={shlex.quote(report)}"

    def command(self, files: list[str], report: str) -> str:
        quoted = " ".join(shlex.quote(f) for f in files)
        return f"{self.test_cmd} {self.report_args(report)} {quoted}"


DEFAULT = RepoProfile("default-pytest")
# SWE-smith's PythonProfile test command (run with the conda env active)
SWESMITH_PYTHON = RepoProfile(
    "swesmith-python", test_cmd="pytest --disable-warnings --color=no --tb=no --verbose -rA"
)

_REGISTRY: dict[str, RepoProfile] = {}
_MIRROR = re.compile(r"^(?P<owner>[^/]+?)__(?P<repo>.+)\.(?P<commit>[0-9a-f]{7,40})$")


def register(profile: RepoProfile, *keys: str) -> RepoProfile:
    """Register `profile` under each key (a record's `repo`, a mirror name, or owner/repo)."""
    if not keys:
        raise ValueError(f"profile {profile.name!r}: register it under at least one repo key")
    for key in keys:
        _REGISTRY[key.lower()] = profile
    return profile


def _keys(repo: str) -> list[str]:
    """Lookup keys of a record's repo, most specific first."""
    name = repo.rstrip("/").split("/")[-1]
    keys = [repo, name]
    m = _MIRROR.match(name)
    if m:  # swesmith mirror name owner__repo.commit8 -> owner/repo
        keys.append(f"{m['owner']}/{m['repo']}")
    return [k.lower() for k in keys]


def profile_for(inst: SweInstance | str) -> RepoProfile:
    repo = inst if isinstance(inst, str) else inst.repo
    for key in _keys(repo):
        if key in _REGISTRY:
            return _REGISTRY[key]
    # a SWE-smith mirror without a profile of its own: the generic Python profile
    return SWESMITH_PYTHON if _MIRROR.match(repo.rstrip("/").split("/")[-1]) else DEFAULT


def registered() -> dict[str, RepoProfile]:
    return dict(_REGISTRY)


def unregister(*keys: str) -> None:
    for key in keys:
        _REGISTRY.pop(key.lower(), None)


# the shipped fixture repositories have no packaging: nothing to install, run from the repo root
for _fixture in ("thundersync-fixtures/minicalc", "thundersync-fixtures/textkit"):
    register(RepoProfile(_fixture.split("/")[1], install_cmds=()), _fixture)
