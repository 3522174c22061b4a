from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from thundersync.sandbox.backends import get_executor
from thundersync.sandbox.executor import (
    Backend,
    ExecResult,
    Limits,
    Session,
    SessionSpec,
)
from thundersync.sandbox.local import LocalExecutor, LocalSession


def test_exec_returns_typed_result_with_exit_code_and_streams(local_session: LocalSession) -> None:
    r = local_session.exec("echo out; echo err >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.timed_out and not r.truncated and not r.ok


def test_commands_run_as_nobody_in_the_task_dir(local_session: LocalSession) -> None:
    r = local_session.exec("id -u; pwd")
    assert r.stdout.split() == ["65534", "/task"]


def test_task_dir_persists_between_execs_and_files_round_trip(local_session: LocalSession) -> None:
    local_session.exec("mkdir -p sub && echo hi > sub/a.txt")
    assert local_session.get_file("sub/a.txt") == b"hi\n"
    local_session.put_file("/task/b/c.bin", b"\x00\x01binary")
    assert local_session.exec("wc -c < b/c.bin").stdout.strip() == "8"
    assert local_session.get_file("missing.txt") is None


def test_get_file_does_not_follow_links_out_of_the_sandbox(local_session: LocalSession) -> None:
    secret = Path("/var/tmp/tsrl-test-secret")
    secret.write_text("TOPSECRET")
    try:
        local_session.exec(f"ln -s {secret} leak")
        assert local_session.get_file("leak") is None
    finally:
        secret.unlink()


def test_timeout_kills_the_whole_tree(local_session: LocalSession) -> None:
    r = local_session.exec("sleep 1000 & sleep 1000; echo never", timeout=1)
    assert r.timed_out and "never" not in r.stdout
    ps = subprocess.run(["pgrep", "-f", "sleep 1000"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def test_output_is_capped_keeping_head_and_tail(local_executor: LocalExecutor) -> None:
    spec = SessionSpec(limits=Limits(output_bytes=1000))
    with local_executor.open(spec) as s:
        r = s.exec("echo START; head -c 50000 /dev/zero | tr '\\0' x; echo; echo END")
    assert r.truncated and r.stdout.startswith("START") and r.stdout.rstrip().endswith("END")
    assert len(r.stdout) < 1100


def test_memory_limit_kills_and_reports(local_executor: LocalExecutor) -> None:
    with local_executor.open(SessionSpec(limits=Limits(memory_mb=128))) as s:
        r = s.exec("python3 -c \"x = bytearray(1024**3); print('done')\"")
    assert "done" not in r.stdout and r.exit_code != 0


def test_workdir_is_copied_and_reset_restores_it(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    (tmp_path / "f.txt").write_text("orig\n")
    s = local_executor.open(SessionSpec(workdir=tmp_path))
    try:
        s.exec("echo changed > f.txt; touch new")
        assert (tmp_path / "f.txt").read_text() == "orig\n"  # host original untouched
        s.reset()
        assert s.exec("cat f.txt; ls").stdout.split() == ["orig", "f.txt"]
    finally:
        s.close()


def test_backend_registry_and_protocol(local_session: LocalSession) -> None:
    assert isinstance(local_session, Session)
    assert get_executor("local").backend is Backend.LOCAL


def test_selftest_cli_contains_every_attack() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "sandbox",
            "selftest",
            "--backend",
            "local",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["attacks"] >= 9
    bad = [d for d in report["details"] if not d["contained"]]
    assert report["contained"] == report["attacks"], bad
    assert out.returncode == 0
