"""`make run` (scripts/run.sh, what it runs after `make setup`): it serves, submits the demo run and
prints a link that carries its token; restarted on the same data folder it serves the same demo
identity, so the earlier runs are still listed."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, port: int) -> tuple[subprocess.Popen[str], str, str, str]:
    """Start run.sh; read (token, run id, run link) off its banner."""
    env = {**os.environ, "TSRL_PORT": str(port), "TSRL_DATA_DIR": str(data)}
    env.pop("TSRL_ADMIN_TOKEN", None)
    proc = subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "demo run:" in line:
            break
    banner = "".join(lines)
    token = re.search(r"demo token:\s+(\S+)", banner)
    run = re.search(r"demo run:\s+\S+ -> (\S+/\?token=(\S+)#/runs/([0-9a-f-]{36}))", banner)
    if not (token and run):
        _stop(proc)
        raise AssertionError(banner)
    assert run.group(2) == token.group(1), banner  # the link opens signed in
    return proc, token.group(1), run.group(3), run.group(1)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C, as a user stops it."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_make_run_keeps_the_demo_identity_and_its_runs(tmp_path: Path) -> None:
    data = tmp_path / "service"
    port = _free_port()
    proc, token1, run1, link = _start(data, port)
    _stop(proc)
    assert link.startswith(f"http://127.0.0.1:{port}/?token=")
    mode = stat.S_IMODE((data / "demo-token").stat().st_mode)
    assert mode == 0o600, oct(mode)

    proc, token2, run2, _ = _start(data, port)
    try:
        assert token2 == token1 and run2 != run1
        res = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/runs",
            headers={"Authorization": f"Bearer {token1}"},
            timeout=30,
        )
        assert res.status_code == 200, res.text
        ids = {r["id"] for r in res.json()["data"]}
        assert ids == {run1, run2}, ids
    finally:
        _stop(proc)
