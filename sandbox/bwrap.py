"""The command lines of a local-backend exec: bubblewrap's mounts and the prlimit rlimits.

Apart from `sandbox.local` (the session's lifecycle and running) to keep both short.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from thundersync.sandbox.executor import Limits, SandboxError, SessionSpec

SANDBOX_UID = 65534
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_ETC_SHARED = [
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "python3",
    "python3.11",
    "ssl",
]
_USR_LINKS = [
    ("usr/bin", "/bin"),
    ("usr/sbin", "/sbin"),
    ("usr/lib", "/lib"),
    ("usr/lib64", "/lib64"),
]


def require(binary: str) -> str:
    path = shutil.which(binary)
    if not path:
        raise SandboxError(
            f"`{binary}` not found: the local sandbox needs it; run "
            "`sudo bash scripts/setup.d/20-sandbox.sh` (installs bubblewrap, util-linux tools)"
        )
    return path


def bwrap_argv(
    spec: SessionSpec,
    dirs: dict[str, Path],
    cmd: list[str],
    env: dict[str, str],
    binds: list[tuple[Path, str]] | None = None,
    net_fds: tuple[int, int] | None = None,
) -> list[str]:
    """bubblewrap's argv; `dirs` maps each writable path inside (the task dir, scratch dirs,
    /tmp when the session has a disk quota) to its host directory, and "/etc" to the session's
    generated passwd / group / hostname / resolv.conf."""
    argv = [require("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns"]
    if net_fds:  # wait until slirp4netns has configured the namespace
        argv += ["--info-fd", str(net_fds[0]), "--block-fd", str(net_fds[1])]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for target, link in _USR_LINKS:
        if Path(link).is_symlink() or Path(link).exists():
            argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/etc"]
    if "/tmp" not in dirs:  # no disk quota: a fresh tmpfs per exec (bounded by memory)
        argv += ["--tmpfs", "/tmp"]
    for name in _ETC_SHARED:
        if Path("/etc", name).exists():
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    names = ["passwd", "group", "hostname"] + (["resolv.conf"] if spec.network else [])
    for name in names:
        argv += ["--ro-bind", str(dirs["/etc"] / name), f"/etc/{name}"]
    for inside, host in dirs.items():
        if inside != "/etc":
            argv += ["--bind", str(host), inside]
    argv += ["--chdir", spec.mount_at]
    for src, dst in binds or []:
        argv += ["--ro-bind", str(src), dst]
    argv += ["--remount-ro", "/"]  # the tmpfs root: nothing new can appear outside the binds
    argv += ["--clearenv"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    return argv + ["--"] + cmd


def limit_argv(limits: Limits, cgroup_on: bool) -> list[str]:
    """prlimit's argv: rlimits of the exec (looser where a cgroup leaf holds the real limit)."""
    mem = limits.memory_mb * 1024 * 1024
    address = mem * 4 if cgroup_on else mem
    nproc = limits.pids * 8 if cgroup_on else limits.pids
    return [
        require("prlimit"),
        f"--cpu={limits.cpu_seconds}",
        f"--as={address}",
        f"--fsize={limits.file_size_mb * 1024 * 1024}",
        f"--nofile={limits.open_files}",
        f"--nproc={nproc}",
        "--core=0",
        "--",
    ]
