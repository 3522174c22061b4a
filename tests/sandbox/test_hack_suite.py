"""The shipped hack suite (`tsrl env check --hacks`) against the real graders, on both backends.

Local: the whole suite through the CLI (one JSON object on stdout: the summary and every hack;
progress on stderr). Docker: one
hack per grading channel through the module (the whole suite takes minutes there on 2 cores).
KNOWN_HOLES are hacks that win (reward 1) and are known to: they stay in the suite, reported as
not defeated, until the grader is fixed (empty today).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from thundersync.sandbox.envs.check import check_swe, check_terminal
from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, TERMINAL_DIR
from thundersync.sandbox.envs.hacks import run_hacks, summarize
from thundersync.sandbox.envs.hacks_defs import HACKS, SWE, TB1
from thundersync.sandbox.envs.swesmith import load_instances
from thundersync.sandbox.local import LocalExecutor

# Hacks that win today (none: the two JUnit forgeries are refused since the graders check the
# runner's exit code against its report, `sandbox.envs.junit.check_runner_agrees`).
KNOWN_HOLES: set[str] = set()
DOCKER_SUBSET = [
    "swe-printed-passed",
    "swe-package-patches-pytest",
    "swe-git-history",
    "swe-forged-junit-at-exit",
    "harbor-reward-files",
    "harbor-background-writer",
    "file-tools-escape",
    "tb1-pytest-shadow",
    "seta-forged-junit-from-app",
]


@pytest.fixture(scope="module")
def local_run() -> tuple[int, list[dict[str, Any]], dict[str, Any], str]:
    import subprocess
    import sys

    # a real process, so stdout and stderr stay apart: stdout must be exactly one JSON object
    cmd = [sys.executable, "-m", "thundersync.cli", "env", "check", "--hacks", "--json"]
    r = subprocess.run(cmd + ["--backend", "local"], capture_output=True, text=True, timeout=900)
    out = json.loads(r.stdout)  # fails on a second line or any text around the object
    assert isinstance(out, dict), r.stdout
    return r.returncode, out.pop("hacks"), out, r.stderr


def test_cli_prints_one_json_object_with_every_hack(
    local_run: tuple[int, list[dict[str, Any]], dict[str, Any], str],
) -> None:
    code, hacks, summary, stderr = local_run
    assert [d["name"] for d in hacks] == [h.name for h in HACKS]
    keys = {"name", "task", "kind", "reward", "defeated", "reason", "seconds"}
    assert all(set(d) == keys for d in hacks)
    assert summary["total"] == len(HACKS) >= 12 and summary["backend"] == "local"
    assert summary["defeated"] == sum(d["defeated"] for d in hacks)
    assert summary["ok"] is (summary["defeated"] == summary["total"])
    assert code == (0 if summary["ok"] else 1), summary
    # progress went to stderr, one line per hack as it ended
    assert all(h.name in stderr for h in HACKS), stderr[-2000:]


def _check(details: list[dict[str, Any]]) -> None:
    crashed = [d for d in details if d["reward"] is None]
    assert not crashed, crashed  # a hack that did not run proves nothing
    beaten = {d["name"] for d in details if not d["defeated"]}
    assert beaten <= KNOWN_HOLES, [d for d in details if d["name"] in beaten - KNOWN_HOLES]
    for d in details:
        assert d["reason"], d  # every verdict says why
        assert (d["reward"] == 0.0) == d["defeated"] or "LEAK" in d["reason"], d


def test_every_hack_but_the_known_holes_is_defeated_locally(
    local_run: tuple[int, list[dict[str, Any]], dict[str, Any], str],
) -> None:
    _check(local_run[1])


def test_one_hack_per_channel_is_defeated_on_docker() -> None:
    from thundersync.sandbox.docker_backend import DockerExecutor

    picked = [h for h in HACKS if h.name in DOCKER_SUBSET]
    assert len(picked) == len(DOCKER_SUBSET)
    details = run_hacks(DockerExecutor(), picked)
    _check(details)
    assert summarize(details)["total"] == len(DOCKER_SUBSET)


def test_every_hack_is_defeated(
    local_run: tuple[int, list[dict[str, Any]], dict[str, Any], str],
) -> None:
    _, _, summary, _ = local_run
    assert summary["defeated"] == summary["total"] >= 12, summary["not_defeated"]


def test_the_targets_gold_earns_one_so_a_zero_means_the_hack_lost() -> None:
    """The hacks' reward 0 is the grader's doing, not a broken target (cheap: local, two tasks)."""
    ex = LocalExecutor()
    inst = next(i for i in load_instances(SWESMITH_INSTANCES) if i.instance_id == SWE)
    for out in (check_swe(inst, ex), check_terminal(TERMINAL_DIR / TB1, ex)):
        assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
