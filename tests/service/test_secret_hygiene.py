"""Secrets stay out of the process list and the logs: `tsrl serve` takes the admin token from
TSRL_ADMIN_TOKEN or a file, refuses `--admin-token`, and no log record or output line of the
service holds any piece of a token (8+ characters), from start to a finished run."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from service_helpers import bearer, wait_final
from typer.testing import CliRunner

from thundersync.cli import app as cli
from thundersync.service.main import create_app
from thundersync.service.settings import AdminTokenError, Settings, read_admin_token

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "hygiene~admin~" + "Zy" * 12  # not hex: no coincidence with digests and ids in logs


def _pieces(secrets: list[str], size: int = 8) -> set[str]:
    return {s[i : i + size] for s in secrets for i in range(len(s) - size + 1)}


def _found(text: str, secrets: list[str]) -> list[str]:
    return sorted(p for p in _pieces(secrets) if p in text)


def _record_text(record: logging.LogRecord) -> str:
    return " ".join([record.getMessage(), str(record.args), record.exc_text or ""])


def test_no_log_record_holds_a_secret(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Everything logged at DEBUG (SQL statements and their parameters included) while tokens are
    made, used, rejected and revoked and a run goes from submission to success."""
    secrets = [ADMIN, "tsrl_not-a-real-token-but-close-enough"]
    with (
        caplog.at_level(logging.DEBUG),
        caplog.at_level(logging.DEBUG, logger="sqlalchemy"),  # SQLAlchemy's own default: WARN
        TestClient(create_app(replace(settings, admin_token=ADMIN))) as c,
    ):
        admin = bearer(ADMIN)
        made = [
            c.post("/api/v1/tokens", json={"name": n, "is_admin": n == "ops"}, headers=admin)
            for n in ("alice", "ops")
        ]
        assert all(m.status_code == 201 for m in made), [m.text for m in made]
        secrets += [m.json()["token"] for m in made]
        alice = bearer(secrets[2])
        assert c.get("/api/v1/runs", headers=bearer(secrets[1])).status_code == 401
        res = c.post("/api/v1/runs", json={"recipe": "grpo-toy"}, headers=alice)
        assert res.status_code == 201, res.text
        assert wait_final(c, res.json()["id"], alice)["status"] == "succeeded"
        path = f"/api/v1/runs/{res.json()['id']}/logs?source=output"
        output = c.get(path, headers=alice).json()["text"]
        assert "fake driver" in output
        c.get("/api/v1/tokens", headers=bearer(secrets[3]))
        assert c.delete(f"/api/v1/tokens/{made[1].json()['id']}", headers=admin).is_success
    records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert any("sqlalchemy" in r.name for r in records)  # the SQL layer was listening
    leaked = [(r.name, r.getMessage()[:300]) for r in records if _found(_record_text(r), secrets)]
    assert leaked == []
    assert any(made[0].json()["public_id"] in r.getMessage() for r in records)  # named safely
    assert _found(output, secrets) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tsrl_serve_reads_the_admin_token_from_a_file_and_never_shows_it(tmp_path: Path) -> None:
    """A real `tsrl serve`: the token is not on its command line, nor in anything it prints while
    it serves tokens, the dashboard with `?token=...`, a run, and its shutdown."""
    token_file = tmp_path / "admin_token"
    token_file.write_text(ADMIN + "\n")
    token_file.chmod(0o600)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSRL_")}
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "thundersync.cli", "serve", "--port", str(port)]
    cmd += ["--data-dir", str(tmp_path / "data"), "--admin-token-file", str(token_file)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base, secrets = f"http://127.0.0.1:{port}", [ADMIN]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        assert _found(argv, secrets) == [], argv
        with httpx.Client(base_url=base, headers=bearer(ADMIN), timeout=30) as api:
            user = api.post("/api/v1/tokens", json={"name": "user"})
            assert user.status_code == 201, user.text
            secrets.append(user.json()["token"])
            assert httpx.get(f"{base}/?token={secrets[1]}").status_code == 200
            assert httpx.get(f"{base}/api/v1/runs?token={ADMIN}").status_code == 401
            run = api.post("/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"updates": 1}})
            assert run.status_code == 201, run.text
            started = time.monotonic() + 60
            while api.get(f"/api/v1/runs/{run.json()['id']}").json()["status"] == "queued":
                assert time.monotonic() < started, "the launcher did not pick the run up"
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log.read_text(errors="replace")
    assert "GET /?token=[redacted]" in text and "Application startup complete" in text, text
    assert _found(text, secrets) == [], text
    for path in (tmp_path / "data").rglob("*"):  # the database, run directories, driver output
        if path.is_file():
            assert _found(path.read_bytes().decode("latin-1"), secrets) == [], path


def test_admin_token_on_the_command_line_is_refused() -> None:
    # an unknown launcher as well: whatever happens, this never starts serving
    args = ["serve", "--admin-token", "argv-secret-123456", "--launcher", "not-a-launcher"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert "visible to every user" in res.output and "--admin-token-file" in res.output
    assert "argv-secret-123456" not in res.output


def test_admin_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert read_admin_token(env={}) == (None, [])
    assert read_admin_token(env={"TSRL_ADMIN_TOKEN": "e" * 32}) == ("e" * 32, [])
    token_file = tmp_path / "token"
    token_file.write_text("  " + "f" * 32 + "\n")
    token_file.chmod(0o600)
    assert read_admin_token(token_file, env={}) == ("f" * 32, [])
    by_env = read_admin_token(env={"TSRL_ADMIN_TOKEN_FILE": str(token_file)})
    assert by_env == ("f" * 32, [])
    token_file.chmod(0o644)
    assert "chmod 600" in read_admin_token(token_file, env={})[1][0]
    assert "32 or more" in read_admin_token(env={"TSRL_ADMIN_TOKEN": "short"})[1][0]
    bad = [
        ({"TSRL_ADMIN_TOKEN": "x" * 32}, token_file, "given twice"),
        ({}, tmp_path / "missing", "cannot read"),
        ({}, tmp_path, "cannot read"),
    ]
    (tmp_path / "two").write_text("two words\n")
    bad.append(({}, tmp_path / "two", "one line"))
    for env, path, message in bad:
        with pytest.raises(AdminTokenError, match=message):
            read_admin_token(path, env=env)
