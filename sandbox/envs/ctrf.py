"""Per-test results from a CTRF report (Common Test Report Format, https://ctrf.io), as SETA's
Harbor-layout tasks write it: `pytest --ctrf /logs/verifier/ctrf.json` (pytest-json-ctrf).

Shape: `{"results": {"tool": {...}, "summary": {...}, "tests": [{"name", "status", ...}]}}`,
status one of passed | failed | skipped | pending | other. pytest-json-ctrf names a test by its
node id without parameters (`test_outputs.py::test_x`, `test_outputs.py::TestC::test_x`); SETA's
weights.json keys are bare function names, so a weight matches the tests whose last `::` part is
that function (a key written as a node id is reduced to its function too). Only `passed` earns
its weight; several tests of one function (files, classes) count as the worst of them.
"""

from __future__ import annotations

import json
from typing import Any

from thundersync.sandbox.envs.junit import ReportError

CTRF_PATH = "/logs/verifier/ctrf.json"  # where SETA's / Harbor's test.sh writes it
STATUSES = ("passed", "failed", "skipped", "pending", "other")
_RANK = {"passed": 0, "skipped": 1, "pending": 2, "other": 2, "failed": 3}


def parse_ctrf(data: bytes, where: str = CTRF_PATH) -> dict[str, str]:
    """Test name -> CTRF status; a report that is not CTRF raises ReportError naming `where`."""
    try:
        doc: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ReportError(f"verifier error: {where} is not valid JSON") from None
    results = doc.get("results") if isinstance(doc, dict) else None
    tests = results.get("tests") if isinstance(results, dict) else None
    if not isinstance(tests, list):
        raise ReportError(
            f'verifier error: {where} is not a CTRF report (expected {{"results": {{"tests": '
            '[{"name": ..., "status": ...}]}}; write it with pytest --ctrf)'
        )
    out: dict[str, str] = {}
    for i, t in enumerate(tests):
        name = t.get("name") if isinstance(t, dict) else None
        status = t.get("status") if isinstance(t, dict) else None
        if not isinstance(name, str) or not name or status not in STATUSES:
            raise ReportError(
                f"verifier error: {where} results.tests[{i}] needs a non-empty 'name' and a "
                f"'status' in {list(STATUSES)}, got {t!r:.120}"
            )
        prev = out.get(name)
        out[name] = status if prev is None or _RANK[status] > _RANK[prev] else prev
    return out


def function_of(name: str) -> str:
    """`test_outputs.py::TestC::test_x[a]` -> `test_x` (a weight key or a CTRF test name)."""
    return name.split("::")[-1].split("[")[0]


def by_function(tests: dict[str, str]) -> dict[str, str]:
    """Function name -> the worst CTRF status of its tests."""
    out: dict[str, str] = {}
    for name, status in tests.items():
        fn = function_of(name)
        if fn not in out or _RANK[status] > _RANK[out[fn]]:
            out[fn] = status
    return out


def weighted(weights: dict[str, float], tests: dict[str, str]) -> tuple[float, float]:
    """(passed weight, total weight) of `weights` over the CTRF `tests`; a weight naming no
    test of the report raises ReportError naming it (the verifier did not run that test)."""
    by_fn = by_function(tests)
    missing = [k for k in weights if function_of(k) not in by_fn]
    if missing:
        raise ReportError(
            f"verifier error: weights.json names {missing[0]!r} but {CTRF_PATH} has no such "
            f"test (tests: {sorted(tests)[:20]}); the verifier must run every weighted test"
        )
    got = sum(w for k, w in weights.items() if by_fn[function_of(k)] == "passed")
    return got, sum(weights.values())
