"""SETA's Harbor layout (weights.json + a CTRF report) and Harbor's network settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from thundersync.sandbox.envs.ctrf import CTRF_PATH, by_function, parse_ctrf, weighted
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.junit import ReportError
from thundersync.sandbox.envs.terminal import Layout, TaskError, load_task
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.envs.terminal_verify import _tb1_verdict, ctrf_verdict
from thundersync.sandbox.executor import ExecResult
from thundersync.sandbox.local import LocalExecutor

SETA = TERMINAL_DIR / "seta-harbor-restock"
HARBOR = TERMINAL_DIR / "harbor-sort-unique"
WEIGHTS = {"test_restock_items": 0.5, "test_restock_sorted": 0.2, "test_total_value": 0.3}
RUN = ExecResult(1, "collected 3 items\nFAILED test_outputs.py::test_total_value\n", "")


def _ctrf(**tests: str) -> bytes:
    rows = [{"name": f"test_outputs.py::{n}", "status": s, "duration": 1} for n, s in tests.items()]
    return json.dumps(
        {"results": {"tool": {"name": "pytest"}, "summary": {}, "tests": rows}}
    ).encode()


class FakeSession:
    """Only what the verdicts use: files the verifier wrote (and a no-op cleanup exec)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def get_file(self, path: str) -> bytes | None:
        return self.files.get(path)

    def exec(self, cmd: str, timeout: float = 60) -> ExecResult:
        return ExecResult(0, "", "")


def _verdict(data: bytes | None, weights: dict[str, float] = WEIGHTS) -> Any:
    files = {} if data is None else {CTRF_PATH: data}
    return ctrf_verdict(FakeSession(files), weights, RUN)  # type: ignore[arg-type]


def test_ctrf_names_match_weights_by_function_worst_status_wins() -> None:
    tests = parse_ctrf(
        json.dumps(
            {
                "results": {
                    "tests": [
                        {"name": "test_outputs.py::test_a", "status": "passed"},
                        {"name": "test_outputs.py::TestB::test_b", "status": "passed"},
                        {"name": "other/test_more.py::test_b", "status": "skipped"},
                        {"name": "test_outputs.py::test_c", "status": "failed"},
                        {"name": "test_outputs.py::test_c", "status": "passed"},
                    ]
                }
            }
        ).encode()
    )
    assert tests["test_outputs.py::test_c"] == "failed"
    assert by_function(tests) == {"test_a": "passed", "test_b": "skipped", "test_c": "failed"}
    # a key may be a node id; only "passed" earns weight
    assert weighted({"test_outputs.py::test_a": 2, "test_b": 1, "test_c": 1}, tests) == (2, 4)
    with pytest.raises(ReportError, match=r"weights.json names 'test_gone' but .*ctrf.json"):
        weighted({"test_a": 1, "test_gone": 1}, tests)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{not json", "ctrf.json is not valid JSON"),
        (b'{"results": {"summary": {}}}', "not a CTRF report"),
        (b'[{"name": "t", "status": "passed"}]', "not a CTRF report"),
        (b'{"results": {"tests": [{"name": "t", "status": "ok"}]}}', r"tests\[0\] needs"),
        (b'{"results": {"tests": [{"status": "passed"}]}}', r"tests\[0\] needs"),
    ],
)
def test_malformed_ctrf_names_the_file(data: bytes, match: str) -> None:
    with pytest.raises(ReportError, match=match):
        parse_ctrf(data)
    v = _verdict(data)
    assert v.reward == 0.0 and "ctrf.json" in v.reason and "FAILED test_outputs.py" in v.reason


def test_ctrf_verdict_partial_missing_and_absent_test() -> None:
    v = _verdict(_ctrf(test_restock_items="passed", test_restock_sorted="failed"))
    assert v.reward == 0.0 and "names 'test_total_value'" in v.reason  # the verifier skipped it
    v = _verdict(
        _ctrf(test_restock_items="passed", test_restock_sorted="failed", test_total_value="passed")
    )
    assert v.reward == pytest.approx(0.8) and v.reason.startswith("weighted: 0.8 of 1")
    assert v.tests == {
        "test_restock_items": "PASSED",
        "test_restock_sorted": "FAILED",
        "test_total_value": "PASSED",
    }
    assert "FAILED test_outputs.py" in v.reason  # a partial reward shows the verifier output
    missing = _verdict(None)
    assert missing.reward == 0.0 and "no CTRF report" in missing.reason
    assert CTRF_PATH in missing.reason and "exit 1" in missing.reason
    assert "FAILED test_outputs.py" in missing.reason
    empty = _verdict(_ctrf())
    assert empty.reward == 0.0 and "no tests ran" in empty.reason


def test_harbor_layout_loads_weights_and_checks_them(tmp_path: Path) -> None:
    task = load_task(SETA)
    assert task.layout is Layout.HARBOR and task.weights == WEIGHTS
    assert not task.network and not task.verify_spec().network
    bad = tmp_path / "t"
    shutil.copytree(SETA, bad)
    (bad / "weights.json").write_text(json.dumps({**WEIGHTS, "test_nope": 1}))
    with pytest.raises(TaskError, match=r"weights.json: weight for 'test_nope' names no test"):
        load_task(bad)


def test_tb1_weight_keys_may_be_node_ids(tmp_path: Path) -> None:
    t = tmp_path / "t"
    shutil.copytree(TERMINAL_DIR / "seta-csv-summary", t)
    keys = {"test_outputs.py::test_rows": 1, "test_total": 3}
    (t / "weights.json").write_text(json.dumps(keys))
    cases = "".join(
        f'<testcase classname="test_outputs" name="{n}">{"" if ok else "<failure/>"}</testcase>'
        for n, ok in (("test_rows", True), ("test_total", False))
    )
    junit = f"<testsuites><testsuite>{cases}</testsuite></testsuites>".encode()
    session = FakeSession({"/logs/r/junit.xml": junit})
    v = _tb1_verdict(session, load_task(t), "/logs/r/junit.xml", RUN)  # type: ignore[arg-type]
    assert v.reward == pytest.approx(0.25) and v.reason == "weighted: 1 of 4"


def _harbor(tmp_path: Path, env: str) -> Path:
    h = tmp_path / "h"
    shutil.rmtree(h, ignore_errors=True)
    shutil.copytree(HARBOR, h)
    toml = (h / "task.toml").read_text().replace("allow_internet = false\n", env)
    (h / "task.toml").write_text(toml)
    return h


@pytest.mark.parametrize(
    ("env", "network"),
    [
        ('network_mode = "public"\n', True),
        ('network_mode = "no-network"\n', False),
        ('network_mode = "allowlist"\n', False),  # no allowed_hosts: all egress denied
        ('network_mode = "allowlist"\nallowed_hosts = []\n', False),
        ("allow_internet = true\n", True),
        ('allow_internet = true\nnetwork_mode = "public"\n', True),
        ('allow_internet = false\nnetwork_mode = "no-network"\n', False),
        ("", False),  # neither: off (the sandbox runs tasks offline unless they ask)
    ],
)
def test_harbor_network_mode_maps_to_session_network(
    tmp_path: Path, env: str, network: bool
) -> None:
    task = load_task(_harbor(tmp_path, env))
    assert task.session_spec().network is network and task.verify_spec().network is network


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (
            'network_mode = "offline"\n',
            r"task.toml: \[environment\] network_mode must be one of "
            r"\['allowlist', 'no-network', 'public'\], got 'offline'",
        ),
        ("network_mode = false\n", r"\[environment\] network_mode must be one of"),
        (
            'allow_internet = true\nnetwork_mode = "no-network"\n',
            r"task.toml: \[environment\] allow_internet = true and network_mode = 'no-network' "
            "disagree",
        ),
        (
            'allow_internet = false\nnetwork_mode = "public"\n',
            "allow_internet = false and network_mode = 'public' disagree",
        ),
        ('allow_internet = "yes"\n', r"allow_internet must be true or false, got 'yes'"),
        (
            'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
            "cannot limit egress to hosts",
        ),
        ('allowed_hosts = ["pypi.org"]\n', "cannot limit egress to hosts"),
        (
            'network_mode = "public"\nallowed_hosts = ["pypi.org"]\n',
            'allowed_hosts is only valid with network_mode = "allowlist"',
        ),
    ],
)
def test_harbor_network_errors_name_file_field_and_values(
    tmp_path: Path, env: str, match: str
) -> None:
    with pytest.raises(TaskError, match=match):
        load_task(_harbor(tmp_path, env))


def test_harbor_phase_network_overrides(tmp_path: Path) -> None:
    # Harbor's [agent] / [verifier] network_mode override the [environment] baseline per phase
    h = _harbor(tmp_path, 'network_mode = "public"\n')
    body = (h / "task.toml").read_text()
    body = body.replace("[agent]\n", '[agent]\nnetwork_mode = "no-network"\n')
    body = body.replace("[verifier]\n", '[verifier]\nnetwork_mode = "public"\n')
    (h / "task.toml").write_text(body)
    task = load_task(h)
    assert not task.session_spec().network and task.verify_spec().network
    (h / "task.toml").write_text(
        body.replace('network_mode = "no-network"', 'network_mode = "lan"')
    )
    with pytest.raises(TaskError, match=r"\[agent\] network_mode must be one of .*got 'lan'"):
        load_task(h)


def test_seta_harbor_partial_credit_end_to_end_ignores_agent_written_ctrf(
    local_executor: LocalExecutor,
) -> None:
    fake = _ctrf(
        test_restock_items="passed", test_restock_sorted="passed", test_total_value="passed"
    )
    env = TerminalEnv(extras={"task": str(SETA), "executor": local_executor})
    try:
        env.init()
        body = json.dumps({"path": "restock.txt", "content": "widget\nnut\nspring\n"})
        env.step(f"<tool>create\n{body}</tool>")  # right items, wrong order, no value.txt
        wrote = env.step(
            "<tool>bash\nmkdir -p /logs/verifier && printf '%s' "
            f"'{fake.decode()}' > {CTRF_PATH} && chmod 444 {CTRF_PATH}</tool>"
        )
        assert "[exit code 0]" in wrote["observations"][0]["content"]  # the forgery is there
        out = env.step("<tool>submit</tool>")
    finally:
        env.close()
    verdict = out["metadata"]["verdict"]
    assert out["done"] and out["reward"] == pytest.approx(0.5), verdict
    assert verdict["tests"]["test_restock_sorted"] == "FAILED"
    assert verdict["tests"]["test_total_value"] == "FAILED"
