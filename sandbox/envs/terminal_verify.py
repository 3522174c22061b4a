"""Verification of a terminal task in a session of its own: the agent's files, the task's tests.

The verifier never runs in the agent's session. When the agent is done, its /app is packed
(`snapshot_app`, as the agent's user: only what it could read), the agent's session is given
back (every process of it gone), and `verify` runs in a fresh session opened for
`TerminalTask.verify_spec()`: /app is restored from the snapshot, /tests and /logs are emptied
and the task's own test files copied in (an agent-written conftest.py, run-tests.sh or test.sh
never gets there), /logs/verifier is created empty (a pre-written reward.txt / reward.json of
the agent cannot exist there), and the verifier runs with `PYTHONSAFEPATH=1` and
`PYTHONNOUSERSITE=1` (an agent's /app/pytest.py or sitecustomize.py is not importable by the
test runner), `-p no:cacheprovider`; the script runs from memory and a process outliving it
voids the verdict (`terminal_reward`). On the docker backend the verifier's execs run as root
(`verify_spec`: TB1 / Harbor runners expect it) and the restored /app is root's (set-id bits
dropped); on the local backend they run as uid 65534 and /app stays the sandbox user's.
TB1 / SETA results come from a JUnit report pytest writes to an unguessable path
(`PYTEST_ADDOPTS=--junitxml=...`), never from lines of the output; Harbor rewards from the
reward file the verifier wrote (reward.txt first, then reward.json, as Harbor reads them): a value outside [0, 1] or not finite is a verifier error (reward
0 with a reason naming the file), never clamped. A Harbor task with weights.json (SETA's current
layout) earns passed weight / total weight from the CTRF report its test.sh writes to
/logs/verifier/ctrf.json (`sandbox.envs.ctrf`; its binary reward.txt is then not used); no report,
a malformed one or a weighted test missing from it is reward 0 with the reason. All of /logs/verifier
is made empty before the verifier starts, so every file read there is the verifier's own.
Failing reasons end with the verifier output.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from thundersync.sandbox.envs import ctrf
from thundersync.sandbox.envs.junit import (
    ReportError,
    Status,
    by_function,
    check_runner_agrees,
    parse_junit,
    report_path,
)
from thundersync.sandbox.envs.terminal import APP, Step, TerminalTask
from thundersync.sandbox.envs.terminal_reward import (
    REWARD_JSON,
    REWARD_TXT,
    leftovers,
    network_hint,
    new_nonce,
    parse_reward_json,
    parse_reward_txt,
    runner,
)
from thundersync.sandbox.executor import ExecResult, Session

SNAPSHOT = "/logs/.tsrl-app.tar"
VERIFY_ENV = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "TEST_DIR": "/tests"}
# Terminal-Bench 1's default runner (a task without run-tests.sh): pytest on its test_outputs.py
DEFAULT_TB1_RUNNER = """#!/bin/bash
cd /app 2>/dev/null || cd /
python3 -m pytest -rA "$TEST_DIR/test_outputs.py"
"""
REWARD_FILES = (REWARD_TXT, REWARD_JSON)  # Harbor's order


@dataclass
class Verdict:
    reward: float
    reason: str
    tests: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)  # Harbor's named scores (reward.json)


def _tail(r: ExecResult, n: int = 600) -> str:
    text = (r.stdout + r.stderr).strip()
    return ("..." + text[-n:]) if len(text) > n else text


def snapshot_app(session: Session) -> bytes | None:
    """The agent's /app as a tar (packed as the agent's user), or None when it cannot be read."""
    r = session.exec(f"rm -f {SNAPSHOT}; tar -C {APP} -cf {SNAPSHOT} . 2>&1", timeout=300)
    data = session.get_file(SNAPSHOT)
    session.exec(f"rm -f {SNAPSHOT}", timeout=60)
    return data if data and r.exit_code in (0, 1) else None


def _prepare(
    session: Session, task: TerminalTask, app_tar: bytes | None, step: Step | None = None
) -> None:
    session.exec("rm -rf /tests/* /tests/.[!.]* /logs/* /logs/.[!.]*", timeout=60)
    if app_tar is not None:
        session.put_file(SNAPSHOT, app_tar)
        # a root verifier (docker) gets /app owned by root, as a Harbor / TB1 agent (root) would
        # leave it (git refuses a repo of another owner), with set-id bits dropped
        r = session.exec(
            f"rm -rf {APP}/* {APP}/.[!.]* {APP}/..?* && tar -C {APP} --no-same-owner "
            f"-xf {SNAPSHOT} 2>&1; rc=$?; rm -f {SNAPSHOT}; if [ $rc = 0 ] && [ $(id -u) = 0 ]; "
            f"then chown 0:0 {APP} && find {APP} -xdev -type f -perm /6000 -exec chmod ug-s {{}} +"
            "; rc=$?; fi; exit $rc",
            timeout=300,
        )
        if r.exit_code != 0:
            raise ReportError(f"could not restore the agent's /app: {_tail(r)}")
    # a step's tests/ goes over the task's (Harbor: same-named files of the step win)
    layers = [task.path / "tests", *([step.tests] if step and step.tests else [])]
    for tests in layers:
        for f in sorted(tests.rglob("*")) if tests.is_dir() else []:
            if f.is_file() and "__pycache__" not in f.parts:
                session.put_file(f"/tests/{f.relative_to(tests)}", f.read_bytes())
    if task.layout.value == "tb1":
        runner = task.verifier.read_bytes() if task.verifier else DEFAULT_TB1_RUNNER.encode()
        session.put_file("/tests/run-tests.sh", runner)
    session.exec("rm -rf /logs/verifier && mkdir -p /logs/verifier", timeout=60)


def verify(
    session: Session,
    task: TerminalTask,
    app_tar: bytes | None = None,
    reward_key: str | None = None,
    step: Step | None = None,
) -> Verdict:
    """Run the task's verifier in `session` (a fresh one: see the module doc) on the agent's
    /app `app_tar` and compute the reward in [0, 1]; `reward_key` (the recipe's) overrides the
    task's choice of a reward.json key."""
    verdict = _verify(session, task, app_tar, reward_key or task.reward_key, step)
    if verdict.reward < 1.0:
        verdict.reason += network_hint(verdict.reason, task.verifier_network_on)
    if task.network_note:
        verdict.reason += f" [note: {task.network_note}]"
    return verdict


def _verify(
    session: Session,
    task: TerminalTask,
    app_tar: bytes | None,
    reward_key: str | None,
    step: Step | None,
) -> Verdict:
    try:
        _prepare(session, task, app_tar, step)
    except ReportError as e:
        return Verdict(0.0, str(e))
    report = report_path()
    addopts = "-p no:cacheprovider" + (
        f" --junitxml={report}" if task.layout.value == "tb1" else ""
    )
    env = {**VERIFY_ENV, "PYTEST_ADDOPTS": addopts}
    script = "/tests/run-tests.sh" if task.layout.value == "tb1" else "/tests/test.sh"
    nonce = new_nonce()
    timeout = step.test_timeout if step else task.test_timeout
    r = session.exec(runner(script, nonce), timeout=timeout, env=env)
    if r.timed_out:
        return Verdict(0.0, f"verifier timeout after {timeout}s: {_tail(r)}")
    r, void = leftovers(r, nonce)
    if void:  # the exec's cleanup killed them; nothing they wrote is read
        return Verdict(0.0, f"{void}: {_tail(r)}")
    if task.layout.value == "tb1":
        return _tb1_verdict(session, task, report, r)
    if task.weights:
        return ctrf_verdict(session, task.weights, r)
    return read_reward(session, r, reward_key)


def _tb1_verdict(session: Session, task: TerminalTask, report: str, r: ExecResult) -> Verdict:
    data = session.get_file(report)
    session.exec(f"rm -rf {shlex.quote(report.rsplit('/', 1)[0])}", timeout=60)
    if data is None:
        return Verdict(
            0.0, f"no test report: the runner ran no pytest (exit {r.exit_code}): {_tail(r)}"
        )
    try:
        parsed = parse_junit(data)
        # run-tests.sh ends in pytest: a report the runner did not write (code under test or a
        # process it started rewrote it, or planted one pytest could not overwrite) is refused
        check_runner_agrees(parsed, r.exit_code, "run-tests.sh")
        by_name = by_function(parsed)
    except ReportError as e:
        return Verdict(0.0, f"{e}: {_tail(r)}")
    tests = {k: v.value for k, v in by_name.items()}
    if not by_name:
        return Verdict(0.0, f"no tests ran: {_tail(r)}", tests)
    if task.weights:
        total = sum(task.weights.values())
        got = sum(
            w
            for n, w in task.weights.items()
            if by_name.get(ctrf.function_of(n)) is Status.PASSED  # a key may be a node id
        )
        return Verdict(got / total, f"weighted: {got:g} of {total:g}", tests)
    failed = [n for n, s in by_name.items() if s not in (Status.PASSED, Status.XFAIL)]
    if failed:
        return Verdict(0.0, f"failed: {failed}: {_tail(r)}", tests)
    return Verdict(1.0, "all tests passed", tests)


def ctrf_verdict(session: Session, weights: dict[str, float], r: ExecResult) -> Verdict:
    """Harbor + weights.json (SETA): passed weight / total weight from the CTRF report."""
    path = ctrf.CTRF_PATH
    data = session.get_file(path)
    if data is None:
        return Verdict(
            0.0,
            f"no CTRF report: the task has weights.json, so its tests/test.sh must write {path} "
            f"(pytest --ctrf {path}); the verifier wrote none (exit {r.exit_code}): {_tail(r)}",
        )
    statuses: dict[str, str] = {}
    try:
        tests = ctrf.parse_ctrf(data, path)
        statuses = {n: s.upper() for n, s in ctrf.by_function(tests).items()}
        if not tests:
            return Verdict(0.0, f"no tests ran: {path} lists no tests: {_tail(r)}")
        got, total = ctrf.weighted(weights, tests)
    except ReportError as e:
        return Verdict(0.0, f"{e}: {_tail(r)}", statuses)
    reason = f"weighted: {got:g} of {total:g} ({path})"
    return Verdict(got / total, reason if got == total else f"{reason}: {_tail(r)}", statuses)


def read_reward(session: Session, r: ExecResult, key: str | None = None) -> Verdict:
    """Harbor: /logs/verifier/reward.txt (one number), else reward.json (named scores, the
    training reward chosen as `terminal_reward.parse_reward_json` says), as the verifier wrote
    them (read after every other process is gone)."""
    try:
        raw = session.get_file(REWARD_TXT)
        if raw is not None:
            value = parse_reward_txt(raw)
            return _harbor(value, "reward.txt", r, {"reward": value})
        raw = session.get_file(REWARD_JSON)
        if raw is None:
            return Verdict(0.0, f"verifier wrote no reward (exit {r.exit_code}): {_tail(r)}")
        value, scores, how = parse_reward_json(raw, key)
        return _harbor(value, f"reward.json ({how})", r, scores)
    except ReportError as e:
        return Verdict(0.0, f"{e}: {_tail(r)}")


def _harbor(value: float, name: str, r: ExecResult, scores: dict[str, float]) -> Verdict:
    reason = name if value == 1.0 else f"{name}: {value:g}: {_tail(r)}"
    return Verdict(value, reason, scores=scores)
