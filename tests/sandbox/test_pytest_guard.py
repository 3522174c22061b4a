"""The SWE-smith grader's guard plugin (`sandbox.envs.pytest_guard`) on real pytest runs: package
code that patches pytest at import is caught; an honest run, and one with an installed plugin or a
conftest hook, is not."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from thundersync.sandbox.envs.fixtures import SWESMITH_DIR
from thundersync.sandbox.envs.hack_scripts import PATCH_REPORTS, REGISTER_PLUGIN
from thundersync.sandbox.envs.junit import Status
from thundersync.sandbox.envs.swesmith_eval import GUARD_SOURCE, guard_findings


def _run(
    tmp_path: Path, package_code: str = "", conftest: str = "", files: dict[str, str] | None = None
) -> dict[str, object]:
    repo = tmp_path / "repo"
    shutil.copytree(SWESMITH_DIR / "repos" / "minicalc", repo)
    (repo / "minicalc" / "ops.py").write_text(
        (repo / "minicalc" / "ops.py").read_text().replace("a + b", "a - b")  # test_add fails
    )
    with (repo / "minicalc" / "__init__.py").open("a") as f:
        f.write(package_code)
    if conftest:
        (repo / "tests" / "conftest.py").write_text(conftest)
    for name, text in (files or {}).items():
        (repo / name).write_text(text)
    guard = tmp_path / "guard"
    guard.mkdir(parents=True)
    (guard / "tsrl_pytest_guard.py").write_bytes(GUARD_SOURCE)
    env = {"PYTHONPATH": str(guard), "TSRL_GUARD_OUT": str(guard / "out.json"), "PATH": "/usr/bin"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    subprocess.run([*cmd, "-p", "tsrl_pytest_guard", "tests"], cwd=repo, env=env, timeout=120)
    return json.loads((guard / "out.json").read_text())


def test_honest_run_has_its_own_verdicts_and_no_findings(tmp_path: Path) -> None:
    out = _run(tmp_path, conftest="def pytest_runtest_logreport(report):\n    pass\n")
    assert out["tampered"] == []
    tests = out["tests"]
    assert isinstance(tests, dict) and tests["tests/test_ops.py::test_add"] == "failed"
    assert tests["tests/test_ops.py::test_power"] == "passed"


def test_a_plugin_module_of_the_repositorys_tests_is_not_tampering(tmp_path: Path) -> None:
    """Hooks registered late (during collection) from the repository's test files are its own
    (the grader restores them); the same registration of a module of the package is not."""
    plugin = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    yield\n"
    )
    late = (
        "import importlib\n\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    config.pluginmanager.register(importlib.import_module({!r}), 'late')\n"
    )
    files = {"tests/helper_plugin.py": plugin, "tests/__init__.py": ""}
    out = _run(tmp_path, conftest=late.format("tests.helper_plugin"), files=files)
    assert out["tampered"] == [], out
    files = {"minicalc/helper_plugin.py": plugin}
    found = _run(tmp_path / "b", conftest=late.format("minicalc.helper_plugin"), files=files)
    assert any("neither a conftest nor installed" in str(x) for x in found["tampered"]), found  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [PATCH_REPORTS, REGISTER_PLUGIN], ids=["patch", "plugin"])
def test_package_code_that_forces_passes_is_caught(tmp_path: Path, code: str) -> None:
    out = _run(tmp_path, package_code=code)
    found = " ".join(map(str, out["tampered"]))  # type: ignore[call-overload]
    assert "tests/test_ops.py::test_add: reported passed, but its call raised" in found, out
    assert ("from_item_and_call was replaced" in found) or ("neither a conftest" in found), out


def test_grader_findings_need_the_guards_own_pass() -> None:
    passed = {"t::a": Status.PASSED, "t::b": Status.PASSED}
    ok = json.dumps({"tests": {"t::a": "passed", "t::b": "passed"}, "tampered": []}).encode()
    assert guard_findings(ok, passed) == []
    assert "no verdict" in guard_findings(None, passed)[0]
    partial = json.dumps({"tests": {"t::a": "passed"}, "tampered": []}).encode()
    assert guard_findings(partial, passed) == ["t::b reported passed, but the guard saw it not run"]
    assert "not its own" in guard_findings(b"[]", passed)[0]
