"""`local` backend: every exec runs under bubblewrap, for machines without a container engine.

Threat model. The command is untrusted model output: assume it is actively hostile.
Covered:
- network: a fresh network namespace with only its own loopback (no host loopback, no
  internet); with `spec.network` slirp4netns gives that namespace egress, never the host's
  loopback or its addresses (`sandbox.netns`); without slirp4netns such a session refuses to open;
- filesystem: read-only /usr (system tools, python3, pytest, git), a minimal generated /etc, fresh
  /proc and /dev, /tmp; the only writable host paths are the session's own task, scratch and /tmp
  directories. Host files outside them are not mounted at all;
- identity: the launcher drops to uid/gid 65534 on the host *before* bubblewrap, so even a
  namespace escape lands as `nobody`; no capabilities, no_new_privs (setuid binaries are inert),
  nested user namespaces disabled, a new session (no TIOCSTI into the caller's terminal);
- processes: a pid namespace (host processes are invisible and unsignalable); when the command
  ends or times out, the namespace's init dies and the kernel kills everything left, and the
  cgroup leaf is swept as a backstop (daemonised / setsid children included);
- resources: rlimits (CPU seconds, address space, file size, open files, processes, no core
  dumps), cgroup-v1 memory / pids / cpu quota where the host has them, a wall-clock timeout,
  output capped to head + tail per stream; disk and inodes: task, scratch and /tmp share one
  loop-mounted filesystem of `Limits.disk_mb` / `Limits.inodes` (`sandbox.quota`; ENOSPC past
  it), /dev/shm is a per-exec tmpfs bounded by the memory limit; `get_file` reads only regular
  files of at most 256 MiB (links resolved inside the sandbox).
Not covered: kernel exploits (bubblewrap shares the host kernel - use the docker backend with a
VM-backed runtime for stronger isolation), CPU cache side channels, disk bandwidth, and the
task directory's own contents (the agent may destroy its workspace; that is its problem).
Without root the uid drop and cgroups are skipped (the caller's uid is used) and a disk quota
cannot be mounted: such a session refuses to open unless its limits say disk_mb=0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

from thundersync.sandbox import cgroups, netns, quota
from thundersync.sandbox.bwrap import (
    BASE_ENV,
    SANDBOX_UID,
    bwrap_argv,
    limit_argv,
    require,
)
from thundersync.sandbox.executor import Backend, ExecResult, SandboxError, SessionSpec
from thundersync.sandbox.output import READ_CHECK, READ_HEAD, READ_MAX, HeadTail, drain
from thundersync.sandbox.owner import current_owner


class LocalSession:
    def __init__(self, spec: SessionSpec, base: Path, privileged: bool) -> None:
        self.spec = spec
        self.id = uuid.uuid4().hex[:12]
        self.privileged = privileged
        self.root = Path(tempfile.mkdtemp(prefix=f"{spec.label}-{self.id}-", dir=base))
        os.chmod(self.root, 0o711)
        current_owner().write(self.root)  # for cleanup_orphans() after a crash of this process
        self.task = self.root / "task"
        self.etc = self.root / "etc"
        self.etc.mkdir()
        (self.etc / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n"
        )
        (self.etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (self.etc / "hostname").write_text("sandbox\n")
        (self.etc / "resolv.conf").write_text(netns.RESOLV_CONF)  # slirp4netns' DNS
        self.scratch = {p: self.root / f"scratch{i}" for i, p in enumerate(spec.scratch)}
        # task, scratch and /tmp on one size- and inode-limited filesystem (`sandbox.quota`)
        self.disk: quota.DiskImage | None = None
        if quota.require(spec.limits, "local sandbox"):
            self.disk = quota.DiskImage(self.root, spec.limits)
            self.task = self.disk.mnt / "task"
            self.scratch = {p: self.disk.mnt / f"scratch{i}" for i, p in enumerate(spec.scratch)}
        self._closed = False
        try:
            self.reset()
        except BaseException:
            self.close()
            raise

    @property
    def workdir_inside(self) -> str:
        return self.spec.mount_at

    def reset(self) -> None:
        """Restore the task directory to a fresh copy of `spec.workdir` (or empty); with a disk
        quota the whole filesystem (task, scratch, /tmp) is a new empty one first."""
        if self.disk is not None:
            self.disk.fresh()
            self.disk.subdir("tmp", 0o1777)
        if self.task.exists():
            shutil.rmtree(self.task)
        try:
            if self.spec.workdir is not None:
                shutil.copytree(self.spec.workdir, self.task, symlinks=True)
            else:
                self.task.mkdir()
        except OSError as e:  # ENOSPC: the task itself is larger than the quota
            lim = self.spec.limits
            raise SandboxError(
                f"copying the task dir failed ({e}); Limits.disk_mb={lim.disk_mb}, "
                f"inodes={lim.inodes}"
            ) from e
        for d in self.scratch.values():
            if d.exists():
                shutil.rmtree(d)
            d.mkdir()
        if self.privileged:
            for dirpath, dirnames, filenames in [
                *os.walk(self.task),
                *(w for d in self.scratch.values() for w in os.walk(d)),
            ]:
                os.chown(dirpath, SANDBOX_UID, SANDBOX_UID)
                for n in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, n), SANDBOX_UID, SANDBOX_UID)

    def _dirs(self) -> dict[str, Path]:
        """Writable paths inside -> host dirs (see `bwrap_argv`); /tmp first: a task dir under
        /tmp must stay visible."""
        tmp = {"/tmp": self.disk.mnt / "tmp"} if self.disk is not None else {}
        return {"/etc": self.etc, **tmp, self.spec.mount_at: self.task, **self.scratch}

    # ---- running --------------------------------------------------------------------------
    def run_argv(
        self,
        cmd: list[str],
        timeout: float,
        env: dict[str, str] | None = None,
        output_cap: int | None = None,
        binds: list[tuple[Path, str]] | None = None,
    ) -> tuple[ExecResult, bytes]:
        if self._closed:
            raise SandboxError(f"session {self.id} is closed")
        limits = self.spec.limits
        cap = output_cap or limits.output_bytes
        full_env = {**BASE_ENV, **self.spec.env, **(env or {})}
        leaf = None
        if self.privileged:
            leaf = cgroups.CgroupLeaf.create(
                f"{self.id}-{uuid.uuid4().hex[:6]}", limits.memory_mb, limits.pids, limits.cpus
            )
        pipes = (os.pipe(), os.pipe()) if self.spec.network else None  # (info, block)
        net_fds = (pipes[0][1], pipes[1][0]) if pipes else None
        inner = limit_argv(limits, leaf is not None)
        inner += bwrap_argv(self.spec, self._dirs(), cmd, full_env, binds, net_fds)
        if self.privileged:
            inner = [
                require("setpriv"),
                f"--reuid={SANDBOX_UID}",
                f"--regid={SANDBOX_UID}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
                *inner,
            ]
        procs = leaf.procs_files if leaf else []
        launcher = 'for p in "$@"; do [ "$p" = -- ] && break; echo $$ > "$p"; shift; done; shift; exec "$@"'
        argv = ["/bin/sh", "-c", launcher, "sh", *procs, "--", *inner]
        out, err = HeadTail(cap), HeadTail(limits.output_bytes)
        start = time.monotonic()
        timed_out = False
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                cwd="/",
                env={"PATH": BASE_ENV["PATH"]},
                pass_fds=net_fds or (),
            )
        except OSError as e:
            if leaf:
                leaf.destroy()
            raise SandboxError(f"could not start bubblewrap: {e}") from e
        finally:
            for fd in net_fds or ():
                os.close(fd)
        assert proc.stdout is not None and proc.stderr is not None
        threads = [drain(proc.stdout, out), drain(proc.stderr, err)]
        net: netns.UserNet | None = None
        try:
            if pipes:  # the sandbox blocks until slirp4netns configured its network
                net = netns.attach(pipes[0][0], pipes[1][1], self.privileged)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill(proc, leaf)
        except BaseException:
            self._kill(proc, leaf)
            if leaf:
                leaf.destroy()
            raise
        finally:
            if proc.poll() is None:
                self._kill(proc, leaf)
            if net:
                net.close()
        for t in threads:
            t.join(timeout=5)
        duration = time.monotonic() - start
        oom = False
        if leaf:
            oom = leaf.oom_kills() > 0
            leaf.destroy()
        code = proc.returncode if proc.returncode is not None else -9
        stderr_text = err.text()
        if code == 1 and not out.total and stderr_text.startswith("bwrap:"):
            raise SandboxError(f"bubblewrap failed to set up the sandbox: {stderr_text.strip()}")
        result = ExecResult(
            exit_code=128 + 9 if timed_out else code,
            stdout=out.text(),
            stderr=stderr_text,
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            oom_killed=oom,
            duration_s=round(duration, 4),
        )
        raw = bytes(out.head) + bytes(out.tail) if not out.truncated else b""
        return result, raw

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], leaf: cgroups.CgroupLeaf | None) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        if leaf:
            leaf.kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def exec(
        self, cmd: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> ExecResult:
        result, _ = self.run_argv(["/bin/bash", "-c", cmd], timeout, env)
        return result

    def _inside(self, path: str) -> str:
        p = PurePosixPath(path)
        return str(p if p.is_absolute() else PurePosixPath(self.spec.mount_at) / p)

    def put_file(self, path: str, data: bytes) -> None:
        """Write a file through the sandbox itself (never follows links as root on the host)."""
        staging = self.root / f"put-{uuid.uuid4().hex[:8]}"
        staging.write_bytes(data)
        os.chmod(staging, 0o644)
        try:
            cmd = [
                "/bin/sh",
                "-c",
                'mkdir -p "$(dirname "$1")" && cat /put.in > "$1"',
                "sh",
                self._inside(path),
            ]
            res, _ = self.run_argv(cmd, 60, binds=[(staging, "/put.in")])
        finally:
            staging.unlink(missing_ok=True)
        if res.exit_code != 0:
            raise SandboxError(f"put_file({path!r}) failed: {res.stderr.strip()}")

    def get_file(self, path: str) -> bytes | None:
        """The bytes of a regular file, read as the sandbox user; None when it is missing,
        unreadable, not a regular file (a link to /dev/zero, a FIFO, /proc) or over READ_MAX."""
        argv = ["/bin/sh", "-c", READ_CHECK + "exec " + READ_HEAD, "sh", self._inside(path)]
        res, raw = self.run_argv(argv, 60, output_cap=READ_MAX + 2)
        ok = res.exit_code == 0 and not res.truncated and len(raw) <= READ_MAX
        return raw if ok else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.disk is not None:
            self.disk.remove()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor:
    backend = Backend.LOCAL

    def __init__(self, base_dir: str | Path | None = None) -> None:
        require("bwrap")
        self.privileged = os.geteuid() == 0
        base = Path(base_dir or os.environ.get("TSRL_SANDBOX_DIR", "/tmp/thundersync-sandbox"))
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o711)
        self.base = base

    def open(self, spec: SessionSpec) -> LocalSession:
        if spec.network:
            netns.require_user_net()  # never the host's network
        return LocalSession(spec, self.base, self.privileged)
