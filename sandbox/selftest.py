"""Attack suite for a sandbox backend: hostile commands that must all be contained.

Each attack runs in a fresh session of the backend and is judged from the *host's* side where
that is possible (did the loopback listener see a connection, did a file appear on the host, is
a host process still alive, is a marker process still running after the session closed), so a
backend cannot pass by merely reporting success. `tsrl sandbox selftest --backend B --json`
prints `{"attacks": N, "contained": N, "details": [...]}`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from thundersync.sandbox.executor import ExecResult, Executor, Limits, Session, SessionSpec


@dataclass
class AttackResult:
    name: str
    contained: bool
    evidence: str
    duration_s: float


def _marker_procs(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
    return found


def _wait_gone(marker: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    left = _marker_procs(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _marker_procs(marker)
    return left


Attack = Callable[[Session], tuple[bool, str]]


def attack_loopback(s: Session) -> tuple[bool, str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = (
        "import socket\n"
        f"for h in ['127.0.0.1','10.0.2.2','10.88.0.1','172.17.0.1','host.containers.internal']:\n"
        "    try:\n"
        f"        socket.create_connection((h,{port}),timeout=2); print('CONNECTED',h)\n"
        "    except Exception as e: print('blocked',h,type(e).__name__)\n"
    )
    r = s.exec(f'python3 -c "{code}"', timeout=30)
    accepted = 0
    with contextlib.suppress(OSError):
        while True:
            conn, _ = srv.accept()
            conn.close()
            accepted += 1
    srv.close()
    ok = accepted == 0 and "CONNECTED" not in r.stdout
    return ok, f"host listener accepted {accepted}; sandbox said: {r.stdout.strip()[:300]}"


def attack_internet(s: Session) -> tuple[bool, str]:
    code = (
        "import socket\n"
        "for h,p in [('1.1.1.1',80),('8.8.8.8',53)]:\n"
        "    try:\n"
        "        socket.create_connection((h,p),timeout=3); print('CONNECTED',h)\n"
        "    except Exception as e: print('blocked',h,type(e).__name__)\n"
        "try:\n    print('RESOLVED', socket.gethostbyname('deb.debian.org'))\n"
        "except Exception as e: print('no dns', type(e).__name__)\n"
    )
    r = s.exec(f'python3 -c "{code}"', timeout=30)
    ok = "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout
    return ok, r.stdout.strip()[:300]


def attack_read_host_file(s: Session) -> tuple[bool, str]:
    token = secrets.token_hex(16)
    secret = Path("/var/tmp") / f"tsrl-selftest-secret-{token[:8]}"
    secret.write_text(token)
    os.chmod(secret, 0o644)  # world-readable on the host: only isolation may stop the read
    try:
        r = s.exec(
            f"cat {secret} /etc/shadow 2>&1; grep -rs {token} /var /root /home /work 2>/dev/null | head",
            timeout=60,
        )
    finally:
        secret.unlink(missing_ok=True)
    leaked = token in r.stdout or token in r.stderr or "root:" in r.stdout
    return not leaked, ("LEAKED" if leaked else "host secret and /etc/shadow unreadable")


def attack_write_outside(s: Session) -> tuple[bool, str]:
    name = f"tsrl-pwn-{secrets.token_hex(4)}"
    targets = [f"/usr/{name}", f"/etc/{name}", f"/var/tmp/{name}", f"/{name}", f"/tmp/{name}"]
    cmd = "; ".join(f"echo x > {t} 2>/dev/null && echo WROTE {t}" for t in targets)
    s.exec(cmd, timeout=30)
    on_host = [t for t in targets if Path(t).exists()]
    for t in on_host:
        with contextlib.suppress(OSError):
            Path(t).unlink()
    return not on_host, f"files created on the host: {on_host}"


def attack_fork_bomb(s: Session) -> tuple[bool, str]:
    marker = f"tsrlbomb{secrets.token_hex(3)}"
    r = s.exec(f"{marker}(){{ {marker}|{marker} & }}; {marker}; sleep 5", timeout=8)
    left = _wait_gone(marker)
    alive = subprocess.run(["true"], check=False).returncode == 0
    after = probe(s, "echo alive")
    ok = not left and alive and after.stdout.strip() == "alive"
    return ok, f"returned after {r.duration_s}s; leftovers {len(left)}; next exec ok={after.ok}"


def attack_memory_bomb(s: Session) -> tuple[bool, str]:
    r = s.exec(
        "python3 -c \"b=[]\nfor i in range(64): b.append(bytearray(256*1024*1024))\nprint('ALLOCATED')\"",
        timeout=60,
    )
    ok = "ALLOCATED" not in r.stdout and r.exit_code != 0
    return ok, f"exit {r.exit_code}, oom_killed={r.oom_killed}: {r.stderr.strip()[-160:]}"


def attack_cpu_spin(s: Session) -> tuple[bool, str]:
    r = s.exec("while :; do :; done", timeout=2)
    ok = r.timed_out and r.duration_s < 15
    return ok, f"timed_out={r.timed_out} after {r.duration_s}s"


def attack_output_flood(s: Session) -> tuple[bool, str]:
    r = s.exec("head -c 100000000 /dev/zero | tr '\\0' A", timeout=120)
    cap = Limits().output_bytes
    ok = r.truncated and len(r.stdout) <= cap + 200
    return ok, f"truncated={r.truncated}, kept {len(r.stdout)} chars of 100000000"


def attack_escape_tree(s: Session) -> tuple[bool, str]:
    marker = f"3133{secrets.randbelow(10**6)}"
    s.exec(
        f"(setsid sleep {marker} >/dev/null 2>&1 &); nohup sleep {marker} >/dev/null 2>&1 & disown; "
        f"python3 -c \"import os,time\nif os.fork()==0:\n os.setsid()\n os.execvp('sleep',['sleep','{marker}'])\"",
        timeout=15,
    )
    s.close()
    left = _wait_gone(marker, 10)
    return not left, f"detached processes alive on the host after close: {len(left)}"


def attack_privileges(s: Session) -> tuple[bool, str]:
    r = s.exec(
        "echo UID=$(id -u); unshare -r sh -c 'cat /etc/shadow >/dev/null 2>&1 && echo ESCALATED_READ; "
        "touch /usr/tsrl-pwn 2>/dev/null && echo ESCALATED_WRITE' 2>&1; "
        "su -c 'echo SU=$(id -u)' 2>&1 </dev/null | head -2; "
        "python3 -c \"import os\ntry:\n os.setuid(0); print('SETUID=0')\nexcept Exception as e: print('setuid', e)\"; "
        "grep CapEff /proc/self/status",
        timeout=30,
    )
    out = r.stdout
    tags = ("UID=0\n", "ESCALATED_READ", "ESCALATED_WRITE", "SU=0", "SETUID=0")
    root = any(tag in out for tag in tags)
    cap = [ln for ln in out.splitlines() if ln.startswith("CapEff")]
    caps_zero = bool(cap) and cap[0].split()[-1].strip("0") == ""
    return (not root and caps_zero), out.strip().replace("\n", " | ")[:300]


def attack_signal_host(s: Session) -> tuple[bool, str]:
    victim = subprocess.Popen(["sleep", "300"])
    try:
        r = s.exec(f"kill -9 {victim.pid} 2>&1; echo rc=$?", timeout=30)
        time.sleep(0.2)
        alive = victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    return alive, f"host pid {victim.pid} alive={alive}; sandbox: {r.stdout.strip()[:200]}"


def attack_disk_fill(s: Session) -> tuple[bool, str]:
    s.exec("head -c 3000000000 /dev/zero > big.bin", timeout=120)
    r = s.exec("stat -c %s big.bin 2>/dev/null || echo 0; rm -f big.bin", timeout=30)
    size = int((r.stdout.split() or ["0"])[0])
    limit = Limits().file_size_mb * 1024 * 1024
    return size <= limit, f"file reached {size} bytes (limit {limit})"


def probe(s: Session, cmd: str) -> ExecResult:
    """An idempotent probe, asked again (at most twice) when the container engine lost its
    output (podman #21741, seen under CI load after bombs and disk fills): read as empty, a
    contained attack or a usable session would look broken. Never for a command with effects."""
    r = s.exec(cmd, timeout=30)
    for _ in range(2):
        if not r.output_lost:
            break
        r = s.exec(cmd, timeout=30)
    return r


def _quota_fill(s: Session, cmd: str, flag: str, limit: int) -> tuple[bool, str]:
    r = s.exec(cmd, timeout=120)
    used = probe(s, f"df -P {flag} /task | tail -1").stdout.split()
    n = int(used[2]) if len(used) > 2 and used[2].isdigit() else -1
    full = "No space left on device" in r.stderr
    after = probe(s, "echo alive")
    alive = after.stdout == "alive\n"
    why = "" if alive else f" (probe exit {after.exit_code}, output_lost={after.output_lost})"
    ok = full and 0 <= n <= limit and alive
    return ok, f"used {n} of {limit}; ENOSPC={full} alive={alive}{why}"


def attack_disk_quota(s: Session) -> tuple[bool, str]:
    fill = "for i in 1 2 3 4; do head -c 500000000 /dev/zero > /tmp/f$i; done"
    return _quota_fill(s, fill, "-k", Limits().disk_mb * 1024)


def attack_inode_quota(s: Session) -> tuple[bool, str]:
    fill = "python3 -c \"for i in range(200000): open(f'i{i}', 'w').close()\""
    return _quota_fill(s, fill, "-i", Limits().inodes + 1024)  # mkfs rounds up per group


def attack_read_dev_zero(s: Session) -> tuple[bool, str]:
    s.exec("ln -s /dev/zero z; mkfifo fifo")
    start = time.monotonic()
    got = [s.get_file(p) for p in ("z", "fifo", "/proc/self/environ")]
    took = time.monotonic() - start
    return got == [None] * 3 and took < 10, f"get_file: {[g is None for g in got]} in {took:.1f} s"


ATTACKS: dict[str, Attack] = {
    "loopback_connect": attack_loopback,
    "internet_connect": attack_internet,
    "read_host_file": attack_read_host_file,
    "write_outside_task": attack_write_outside,
    "fork_bomb": attack_fork_bomb,
    "memory_bomb": attack_memory_bomb,
    "cpu_spin_past_timeout": attack_cpu_spin,
    "output_flood_100mb": attack_output_flood,
    "escape_process_tree": attack_escape_tree,
    "gain_privileges": attack_privileges,
    "signal_host_process": attack_signal_host,
    "file_size_bomb": attack_disk_fill,
    "disk_fill_2gb": attack_disk_quota,
    "inode_fill_200k": attack_inode_quota,
    "get_file_dev_zero_fifo_proc": attack_read_dev_zero,
}


def run_selftest(executor: Executor, only: list[str] | None = None) -> dict[str, object]:
    details = []
    for name, attack in ATTACKS.items():
        if only and name not in only:
            continue
        start = time.monotonic()
        session = executor.open(SessionSpec(label=f"selftest-{name}"))
        try:
            contained, evidence = attack(session)
        except Exception as e:  # a crash of the harness is a failure to demonstrate containment
            contained, evidence = False, f"{type(e).__name__}: {e}"
        finally:
            session.close()
        details.append(
            asdict(AttackResult(name, contained, evidence, round(time.monotonic() - start, 2)))
        )
    host_ok = subprocess.run(["true"], check=False).returncode == 0
    return {
        "attacks": len(details),
        "contained": sum(1 for d in details if d["contained"]) if host_ok else 0,
        "host_ok": host_ok,
        "details": details,
    }
