"""The SWE-smith grader's reading of the guard plugin's verdict (`sandbox.envs.pytest_guard`).

`guard_findings`: why the verdict does not back the JUnit report (no verdict, not signed with
the grader's key, tampering the guard saw, a reported pass the guard did not see).
`guard_backed`: the report's statuses where an xfail / xpass / skip the guard does not back is a
failure (non-pass outcomes count only where the instance's own tests decided them).
"""

from __future__ import annotations

import hashlib
import hmac
import json

from thundersync.sandbox.envs.junit import Status

# a status other than passed counts only with the guard's verdict of the same kind
_BACKED = {
    Status.PASSED: ("passed",),
    Status.XPASS: ("passed",),
    Status.XFAIL: ("xfailed",),
    Status.SKIPPED: ("skipped", "xfailed"),
}


def sign(verdict: dict[str, object], key: bytes) -> str:
    """The guard's signature of its verdict (`pytest_guard.sign`: HMAC-SHA256, canonical JSON)."""
    return hmac.new(key, json.dumps(verdict, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _verdict(
    guard: bytes | None, key: bytes = b""
) -> tuple[dict[str, str], list[str], dict[str, str]] | str:
    """(the guard's outcome per test, tampering it saw, why per downgraded test), or why the
    verdict cannot be used (with `key`: also when it is not signed with it)."""
    if guard is None:
        return "the guard plugin wrote no verdict (the run did not finish as pytest does)"
    try:
        data = json.loads(guard)
        body = {"tests": data["tests"], "tampered": data["tampered"], "why": data.get("why", {})}
        if key and not hmac.compare_digest(str(data.get("mac")), sign(body, key)):
            return "the guard plugin's verdict is not its own (not signed with the grader's key)"
        return dict(data["tests"]), [str(x) for x in data["tampered"]], dict(body["why"])
    except (ValueError, KeyError, TypeError):
        return "the guard plugin's verdict is not its own (unreadable)"


def guard_findings(guard: bytes | None, statuses: dict[str, Status], key: bytes = b"") -> list[str]:
    """Why the guard plugin's own verdict does not back the report (empty: it does): no verdict
    at all, tampering it saw, or a graded test the report has passed that the guard saw fail or
    never saw run."""
    v = _verdict(guard, key)
    if isinstance(v, str):
        return [v]
    seen, found, _ = v
    for t, st in statuses.items():
        if st is Status.PASSED and seen.get(t) != "passed":
            found.append(f"{t} reported passed, but the guard saw it {seen.get(t) or 'not run'}")
    return found


def guard_backed(
    guard: bytes | None, statuses: dict[str, Status], key: bytes = b""
) -> tuple[dict[str, Status], list[str]]:
    """`statuses` where a reported xfail / xpass / skip the guard does not back (it saw the test
    fail, or the skip / xfail decided by code that is not the instance's tests) is FAILED, and
    a note per such test."""
    v = _verdict(guard, key)
    seen, why = ({}, {}) if isinstance(v, str) else (v[0], v[2])
    backed, notes = dict(statuses), []
    for t, st in statuses.items():
        own = seen.get(t) or "not run"
        if st is not Status.PASSED and st in _BACKED and own not in _BACKED[st]:
            backed[t] = Status.FAILED
            notes.append(
                f"{t} reported {st.value}, the guard saw it {own} {why.get(t, '')}".strip()
            )
    return backed, notes
