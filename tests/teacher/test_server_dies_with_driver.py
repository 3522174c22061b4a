"""A teacher server started by a driver dies with it, even when the driver is SIGKILLed.

The driver side is the real launcher code (`rollout.vllm_server.VLLMServer.start`, what
driver/assemble.py runs for `teacher.backend: vllm`); the server is a stand-in for vLLM's
OpenAI server (`-m vllm.entrypoints.openai.api_server`, served on /health, with one worker
process like vLLM's engine core), so the test needs neither vLLM nor its 35 s start. The driver
starts the server from a thread that then exits (as a restart from a rollout thread would): the
server must outlive that thread and still die with the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

FAKE_SERVER = """
import argparse, http.server, os, subprocess, sys
p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
args, _ = p.parse_known_args()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["FAKE_VLLM_PIDS"], "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", args.port), H).serve_forever()
"""

DRIVER = """
import json, sys, threading, time
from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig
server = VLLMServer(VLLMServerConfig(model="tiny", start_timeout_s=60), log_dir=sys.argv[1])
t = threading.Thread(target=server.start)
t.start(); t.join()
print(json.dumps({"guard": server.proc.pid}), flush=True)
time.sleep(600)
"""


def _fake_vllm(tmp: Path) -> Path:
    pkg = tmp / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER)
    python = tmp / "vllm-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp / "fake"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_teacher_server_dies_with_a_sigkilled_driver(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    env = {
        **os.environ,
        "TSRL_VLLM_PYTHON": str(_fake_vllm(tmp_path)),
        "FAKE_VLLM_PIDS": str(pids_file),
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, f"the driver did not start the server; log: {list(tmp_path.rglob('*.log'))}"
        guard = json.loads(line)["guard"]
        server, worker = (int(x) for x in pids_file.read_text().split())
        pids = [guard, server, worker]
        time.sleep(1.0)  # the starting thread is gone: the server must still run
        assert not any(_gone(p) for p in pids), "the server died with the starting thread"
        # the server runs in a process group of its own, apart from the driver's
        assert os.getpgid(server) == guard != os.getpgid(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        assert _wait_gone(pids) == [], "teacher server processes outlived the driver"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_server_stop_ends_guard_server_and_workers(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig

    pids_file = tmp_path / "pids"
    monkeypatch.setenv("TSRL_VLLM_PYTHON", str(_fake_vllm(tmp_path)))
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids_file))
    server = VLLMServer(VLLMServerConfig(model="tiny", start_timeout_s=60), log_dir=tmp_path)
    server.start()
    assert server.proc is not None and server.is_healthy()
    pids = [server.proc.pid, *(int(x) for x in pids_file.read_text().split())]
    server.stop(timeout_s=20)
    assert _wait_gone(pids) == []
