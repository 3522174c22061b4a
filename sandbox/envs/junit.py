"""Test results from a JUnit XML report (pytest `--junitxml`), never from the output stream.

The graders read a report pytest writes to a path the agent's code does not know (a random name
under a directory outside the task directory, made fresh for each verification), so printed
`PASSED <id>` lines cannot earn reward. Pytest names a test case as `mangle_test_address` does:
`classname` = the file path with `/` -> `.` and `.py` dropped, then any classes; `name` = the
function name with its parameters. `node_key` maps a pytest node id to that pair.
"""

from __future__ import annotations

import re
import secrets
import xml.etree.ElementTree as ET
from enum import StrEnum

REPORT_DIR = "/logs"  # a scratch dir of every verifying session (outside the task directory)


class Status(StrEnum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


class ReportError(ValueError):
    """No usable report: the runner crashed, ran no pytest, or the file is not JUnit XML."""


def report_path(base: str = REPORT_DIR) -> str:
    """A fresh, unguessable report path (pytest creates the parent directory)."""
    return f"{base}/.tsrl-report-{secrets.token_hex(16)}/junit.xml"


def node_key(node_id: str) -> tuple[str, str]:
    """(classname, name) of the JUnit test case pytest writes for `node_id`."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _status(case: ET.Element) -> Status:
    tags = {child.tag: child for child in case}
    if "error" in tags:
        return Status.ERROR
    if "failure" in tags:
        return Status.FAILED
    if "skipped" in tags:
        kind = tags["skipped"].get("type", "")
        return Status.XFAIL if kind == "pytest.xfail" else Status.SKIPPED
    return Status.PASSED


def parse_junit(data: bytes) -> dict[tuple[str, str], Status]:
    """(classname, name) -> status; an error + failure of one case (setup, call) is an error."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise ReportError(f"the test report is not valid XML ({e})") from None
    out: dict[tuple[str, str], Status] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        st = _status(case)
        prev = out.get(key)
        if prev is None or prev is Status.PASSED or st in (Status.ERROR, Status.FAILED):
            out[key] = st
    return out


def check_runner_agrees(report: dict[tuple[str, str], Status], exit_code: int, runner: str) -> None:
    """The report must be the runner's own: pytest exits nonzero only when a test failed or it
    broke, so a report without a failing test from a runner that exited nonzero was written by
    something else (code under test rewriting it at exit, or a planted file pytest could not
    overwrite). ReportError, so it never earns a reward."""
    failing = any(s in (Status.FAILED, Status.ERROR) for s in report.values())
    if exit_code != 0 and not failing:
        raise ReportError(
            f"{runner} exited {exit_code} but its report lists no failing test: the report is not "
            "the runner's own, so it is not trusted"
        )


def statuses_for(ids: list[str], report: dict[tuple[str, str], Status]) -> dict[str, Status]:
    """Status of each pytest node id found in `report` (missing ids are left out)."""
    return {i: report[node_key(i)] for i in ids if node_key(i) in report}


def uncollected_files(report: dict[tuple[str, str], Status], files: list[str]) -> frozenset[str]:
    """The test files among `files` that pytest failed to collect (a collection error is a case
    with an empty classname named after the module: `tests/test_x.py` -> `tests.test_x`)."""
    broken = {n for (c, n), st in report.items() if not c and st is Status.ERROR}
    return frozenset(f for f in files if f.removesuffix(".py").replace("/", ".") in broken)


def by_function(report: dict[tuple[str, str], Status]) -> dict[str, Status]:
    """Function name (parameters dropped) -> the worst status of its cases (TB1 / SETA weights
    name test functions)."""
    rank = {Status.PASSED: 0, Status.XFAIL: 0, Status.XPASS: 0, Status.SKIPPED: 1}
    out: dict[str, Status] = {}
    for (_, name), st in report.items():
        fn = name.split("[")[0]
        if fn not in out or rank.get(st, 2) > rank.get(out[fn], 2):
            out[fn] = st
    return out
