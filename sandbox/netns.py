"""Isolated egress for the local backend: slirp4netns on the sandbox's own network namespace.

A sandbox with network on (`SessionSpec.network`, a task's `allow_internet`) never shares the
host's network namespace: sharing it would let the command reach every loopback service of the
host (PostgreSQL as superuser, Redis with the training bus, ...). Instead bubblewrap creates a
fresh namespace as always and, while the sandbox blocks on `--block-fd`, slirp4netns attaches a
user-mode TCP/IP stack to it (tap0 10.0.2.100, gateway 10.0.2.2, DNS 10.0.2.3):
- `--disable-host-loopback`: the gateway does not forward to the host's 127.0.0.0/8, and the
  sandbox's 127.0.0.1 is its own loopback;
- as root, every address of the host (eth0, bridges) gets a `prohibit` route inside the
  sandbox's namespace, so services the host binds on 0.0.0.0 do not answer either; the command
  has no capability in that namespace and cannot remove the routes;
- slirp4netns runs with `--enable-sandbox --enable-seccomp` and dies with the exec (exit fd).
Without slirp4netns the session refuses to open (see `require_user_net`), it never falls back
to the host's network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

from thundersync.sandbox.executor import SandboxError

SANDBOX_DNS = "10.0.2.3"
RESOLV_CONF = f"nameserver {SANDBOX_DNS}\n"
NO_USER_NET = (
    "network access was asked for (SessionSpec.network: a Harbor task's [environment] "
    "allow_internet = true) but the local backend has no user-mode networking: slirp4netns "
    "is not installed, and sharing the host's network would expose its loopback services "
    "(PostgreSQL, Redis). Fix: run `sudo bash scripts/setup.d/20-sandbox.sh` (installs "
    "slirp4netns), or set allow_internet = false in the task, or use the docker backend"
)


def require_user_net() -> str:
    """The slirp4netns binary, or a SandboxError saying which field asked and the fix."""
    path = shutil.which("slirp4netns")
    if not path:
        raise SandboxError(NO_USER_NET)
    return path


def read_child_pid(fd: int, timeout: float = 10.0) -> int | None:
    """bubblewrap's `--info-fd` JSON: the host pid of the sandbox's init (None on EOF)."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"}" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SandboxError(f"bubblewrap wrote no sandbox info within {timeout:g} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            return None  # bwrap failed before the sandbox existed; its stderr says why
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError) as e:
        raise SandboxError(f"unreadable bubblewrap info {data[:200]!r}: {e}") from None


def host_addresses() -> list[str]:
    """Every IPv4 address of the host's interfaces except loopback (slirp is IPv4 only)."""
    ip = shutil.which("ip")
    if not ip:
        return []
    out = subprocess.run([ip, "-o", "-4", "addr", "show"], capture_output=True, text=True)
    addrs = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.ip_interface(parts[parts.index("inet") + 1]).ip
            if not addr.is_loopback:
                addrs.append(str(addr))
    return addrs


class UserNet:
    """slirp4netns attached to one running sandbox; `close()` stops it."""

    def __init__(self, child_pid: int, privileged: bool, timeout: float = 10.0) -> None:
        netns = f"/proc/{child_pid}/ns/net"
        if privileged:
            self._prohibit_host_addresses(netns)
        ready_r, ready_w = os.pipe()
        self._exit_r, self._exit_w = os.pipe()
        argv = [require_user_net(), "--configure", "--mtu=65520", "--disable-host-loopback"]
        if privileged:  # its own mount namespace + seccomp (needs root to set up)
            argv += ["--enable-sandbox", "--enable-seccomp"]
        argv += [f"--ready-fd={ready_w}", f"--exit-fd={self._exit_r}"]
        argv += ["--netns-type=path", netns, "tap0"]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in _stop)
        self._closed = False
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=(ready_w, self._exit_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                start_new_session=True,
                cwd="/",
            )
        finally:
            os.close(ready_w)
            os.close(self._exit_r)
        try:
            ok = select.select([ready_r], [], [], timeout)[0] and os.read(ready_r, 1) == b"1"
        finally:
            os.close(ready_r)
        if not ok:
            err = self._stop()
            raise SandboxError(f"slirp4netns did not configure the sandbox network: {err}")

    @staticmethod
    def _prohibit_host_addresses(netns: str) -> None:
        nsenter, ip = shutil.which("nsenter"), shutil.which("ip")
        if not nsenter or not ip:
            raise SandboxError("nsenter and ip (util-linux, iproute2) are needed for networking")
        for addr in host_addresses():
            r = subprocess.run(
                [nsenter, f"--net={netns}", ip, "route", "add", "prohibit", f"{addr}/32"],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise SandboxError(f"could not fence off host address {addr}: {r.stderr.strip()}")

    def _stop(self) -> str:
        """Stop slirp4netns (closing the exit fd ends it); the tail of its log."""
        if self._closed:
            return ""
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self._exit_w)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._log.seek(0)
        err = self._log.read().decode("utf-8", "replace")
        self._log.close()
        return err.strip()[-500:]

    def close(self) -> None:
        self._stop()


def attach(info_fd: int, block_fd: int, privileged: bool) -> UserNet | None:
    """Network for the sandbox blocked on `block_fd` (bubblewrap's `--info-fd` is `info_fd`),
    then let it run; closes both fds. None when bubblewrap died before the sandbox existed."""
    try:
        pid = read_child_pid(info_fd)
        if pid is None:
            return None
        net = UserNet(pid, privileged)
        with contextlib.suppress(BrokenPipeError):
            os.write(block_fd, b"1")
        return net
    finally:
        os.close(info_fd)
        os.close(block_fd)
