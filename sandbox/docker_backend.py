"""`docker` backend: one container per session through the docker SDK.

In production this talks to Docker; on these machines (no Docker engine) it talks to podman's
Docker-compatible socket (`podman system service`), started on demand by `ensure_podman_socket`
- the same SDK code path. The container runs `sleep infinity` from the task image as uid 65534
with no network (unless the task allows it), all capabilities dropped, no-new-privileges,
memory / cpu / pids limits and nofile / nproc / fsize ulimits (podman needs explicit nofile and
nproc ulimits). The task directory is copied in with put_archive; the file tools' `put_file` /
`get_file` act as uid 65534 through execs (never root through the archive API), so they reach
exactly what the agent's commands reach. Pid 1 is the engine's init
(`init=True`: docker-init / tini on Docker, catatonit on podman), so killed processes are reaped:
with `sleep` as pid 1 the zombies of a fork bomb kept the pids limit exhausted forever. Each exec
is wrapped in coreutils `timeout` inside a small `sh` whose builtin `kill -9 -1` (repeated, no
fork needed) kills every process of the sandbox user when the command returns - no process
outlives its exec (setsid / daemonised children and fork bombs included); the host also watches
the exec and repeats the kill on a timeout. If an exec cannot even start (pids exhausted), the
session recovers: `kill -9 -1` from a fresh exec, retried, else a container restart (same
filesystem), then the exec is retried once. Closing removes the container (and everything left
in it). An exit of 137 that is not a timeout is reported as oom_killed (the memory cgroup's OOM
killer is the only other source of SIGKILL).

Every container carries the labels `thundersync.sandbox=1`, `thundersync.owner_pid`,
`thundersync.owner_host` and `thundersync.owner_start` (the owner's process start time), so
`sandbox.pool.cleanup_orphans()` can remove the containers of a crashed owner.

`SessionSpec.exec_user = "root"` (terminal verifiers): `exec` runs as uid 0 with only the
container's CHOWN / DAC_OVERRIDE / FOWNER capabilities and no-new-privileges; after the command
every process but pid 1 and `sleep infinity` is killed (a root `kill -9 -1` would stop the
container), and `reset` replaces the container (root may have written anywhere), so such a
session is never reused dirty. The file tools still act as uid 65534. `exec_user` naming a user of
the image (a task Dockerfile's non-root USER) runs `exec` and the file tools as that uid:gid
(resolved in the container); such a session is also replaced on reset, since the image's own
files belong to that uid and cannot be told apart from what the agent wrote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from thundersync.sandbox.bridge_net import isolate_bridge
from thundersync.sandbox.docker_support import (  # noqa: F401  (ensure_podman_socket, _ping: re-exported)
    LABEL,
    PODMAN_SOCKET,
    UID,
    _ping,
    _tar_of,
    container_kwargs,
    ensure_podman_socket,
)
from thundersync.sandbox.executor import (
    Backend,
    ExecOutputLost,
    ExecResult,
    SandboxError,
    SessionSpec,
)
from thundersync.sandbox.output import HeadTail

DEFAULT_IMAGE = os.environ.get("TSRL_SANDBOX_IMAGE", "thundersync-sandbox:bookworm")
log = logging.getLogger(__name__)
# Podman's exec API can lose a command's output and still report exit 0 (podman #21741, #18025:
# `exec cat file` -> ''; ~1% of execs here under a 2-process CPU load). Every wrapper ends each
# stream with a trailer, written after every other process is gone: an exec whose trailer did
# not arrive lost output and says so (`output_lost`; get_file retries, it only reads).
_TRAILER = "printf '\\036tsrl-end:%s\\036' \"$rc\"; printf '\\036tsrl-end:%s\\036' \"$rc\" >&2; "
_TRAILER_RE = re.compile(rb"\x1etsrl-end:(\d+)\x1e$")
# after the command: SIGKILL every process of the sandbox user (the shell builtin needs no fork,
# so it works with the pids limit exhausted; repeated for children forked during a pass)
_EXEC_WRAPPER = (
    'timeout -k 2 "$1" bash -c "$2"; rc=$?; '
    "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do kill -9 -1 2>/dev/null; done; "
    f"{_TRAILER}exit $rc"
)
# root execs (verifiers): a root `kill -9 -1` would kill `sleep infinity` and stop the
# container, so kill every pid but pid 1, the main process ($3) and this shell itself
_ROOT_WRAPPER = (
    'timeout -k 2 "$1" bash -c "$2"; rc=$?; [ -n "$3" ] && for i in 1 2 3 4 5; do '
    'for p in /proc/[0-9]*; do p=${p#/proc/}; case " 1 $3 $$ " in *" $p "*) ;; '
    '*) kill -9 "$p" 2>/dev/null;; esac; done; done; ' + _TRAILER + "exit $rc"
)
_STAGE = "/run/tsrl-stage"  # root-owned 0711: put_file's bytes wait here under random names
_WRAPPER_NAME = "tsrl-exec"  # $0 of the wrapper: its own errors read "tsrl-exec: 1: ..."
_RUNTIME_FAILURE = ("OCI runtime error", "exec failed", "unable to start container process")
# what sh / timeout print when the pids limit is exhausted; the file tools run only our own
# fixed scripts, so these words in their stderr mean the script did not run, not that it failed
_NO_FORK = ("Cannot fork", "fork system call failed", "Resource temporarily unavailable")


def _no_wrapper(code: int, stderr: str) -> bool:
    """No trailer is due: the engine could not start the wrapper, or a signal killed it (the
    OOM killer, or the command itself: the wrapper runs as its user, so `kill -1` reaches it;
    a hostile command's result is data, never an error)."""
    return code > 128 or (code in (125, 126) and any(m in stderr for m in _RUNTIME_FAILURE))


def _did_not_start(r: ExecResult | None) -> bool:
    """The exec never ran the command: the engine could not start it, or the wrapper could
    not fork `timeout` (pids exhausted)."""
    if r is None:
        return True
    if r.stdout or r.timed_out:
        return False
    if r.exit_code in (125, 126) and any(m in r.stderr for m in _RUNTIME_FAILURE):
        return True
    if r.exit_code == 125 and r.stderr.startswith("timeout: fork system call failed"):
        return True  # coreutils timeout could not fork the command's bash
    return r.stderr.startswith(f"{_WRAPPER_NAME}: ") and "Cannot fork" in r.stderr


class DockerSession:
    def __init__(self, client: Any, spec: SessionSpec, image: str) -> None:
        self.client, self.spec, self.image = client, spec, spec.image or image
        user = spec.exec_user
        if user is not None and (not user or not re.fullmatch(r"[A-Za-z0-9_.:-]+", user)):
            raise SandboxError(
                "SessionSpec.exec_user must be None (the sandbox user), 'root' or a user of the "
                f"image (name or uid[:gid]), got {user!r}"
            )
        self._root = user == "root"
        # an image's own user (a task Dockerfile's USER): its files came with the image, so a
        # reset replaces the container (as for root) instead of deleting what that uid owns
        self._own_user = user is not None and not self._root
        self._user = f"{UID}:{UID}"
        self._keep = ""  # pid of `sleep infinity`: root execs' cleanup must spare it
        self._closed = False
        self._start()
        try:
            self._prepare()
        except BaseException:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)
            raise

    def _start(self) -> None:
        try:
            if self.spec.network:
                isolate_bridge(self.client)  # before the container can send anything
            self.container = self.client.containers.run(
                self.image, ["sleep", "infinity"], detach=True, **container_kwargs(self.spec)
            )
        except Exception as e:
            hint = ""
            if "init" in str(e) or "catatonit" in str(e):
                hint = " (podman needs catatonit for init=True: apt-get install catatonit)"
            raise SandboxError(f"could not start a container from {self.image!r}: {e}{hint}") from e
        self._find_main()

    def _find_main(self) -> None:
        """Root sessions: note pid 1's only child (`sleep infinity`) so that the cleanup after a
        root exec kills everything else (a root `kill -9 -1` would stop the container)."""
        if not self._root:
            return
        with contextlib.suppress(Exception):
            code, out = self.container.exec_run(["cat", "/proc/1/task/1/children"], user="0")
            pids = out.decode().split() if code == 0 else []
            self._keep = pids[0] if len(pids) == 1 and pids[0].isdigit() else ""

    @property
    def workdir_inside(self) -> str:
        return self.spec.mount_at

    def _root_exec(self, cmd: list[str]) -> None:
        """Housekeeping as root (a stage dir, a reset) that only fails when the container
        cannot run it (a fork bomb holds the pids): recover as `exec` does, then retry."""
        if self._try_exec(cmd, "0", polls=300) == 0:
            return
        self._kill_leftovers()
        if self._try_exec(cmd, "0", polls=300) == 0:
            return
        self._restart()
        code = self._try_exec(cmd, "0", polls=300)
        if code != 0:
            raise SandboxError(f"setting up the container failed: {cmd} -> {code}")

    def _resolve_user(self, user: str) -> str:
        """`uid:gid` of an image user (a name, uid or uid:gid); root is never an agent's."""
        name, _, group = user.partition(":")
        code, out = self.container.exec_run(["sh", "-c", f'id -u "{name}" && id -g "{name}"'])
        ids = out.decode().split() if code == 0 else []
        if len(ids) != 2 and not name.isdigit():
            raise SandboxError(f"image {self.image!r}: user {user!r} does not exist in it")
        uid = ids[0] if len(ids) == 2 else name
        gid = group or (ids[1] if len(ids) == 2 else uid)
        if uid == "0":
            raise SandboxError(f"image {self.image!r}: user {user!r} is root; agents never are")
        return f"{uid}:{gid}"

    def reset(self) -> None:
        """Back to a fresh session: no process of the sandbox user left, nothing it wrote
        anywhere (task and scratch dirs, /tmp, /var/tmp, /dev/shm, ...), task dir re-copied.
        A root session (`exec_user`) gets a new container: root may have written anywhere."""
        if self._root or self._own_user:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)
            self._start()
        self._prepare()

    def _prepare(self) -> None:
        if self._own_user:
            self._user = self._resolve_user(str(self.spec.exec_user))
        self._kill_leftovers()
        dirs = [self.spec.mount_at, *self.spec.scratch]
        q = " ".join(f"'{d}'" for d in dirs)
        wipe = "" if self._own_user else f"find / /dev/shm -xdev -user {UID} -delete 2>/dev/null; "
        self._root_exec(["sh", "-c", f"{wipe}rm -rf {q} && mkdir -p {q} && chown {self._user} {q}"])
        if self.spec.workdir is not None:
            files: dict[str, tuple[bytes, int]] = {}
            subdirs = []
            root = Path(self.spec.workdir)
            for p in sorted(root.rglob("*")):
                rel = str(p.relative_to(root))
                if p.is_dir() and not p.is_symlink():
                    subdirs.append(rel)
                elif p.is_file() and not p.is_symlink():
                    files[rel] = (p.read_bytes(), p.stat().st_mode & 0o777)
            self.container.put_archive(self.spec.mount_at, _tar_of(files, subdirs))

    def exec(
        self, cmd: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> ExecResult:
        if self._closed:
            raise SandboxError("session is closed")
        result = self._try_exec_once(cmd, timeout, env)
        if _did_not_start(result):  # e.g. pids exhausted: kill what is left, retry
            self._kill_leftovers()
            result = self._try_exec_once(cmd, timeout, env)
        if _did_not_start(result):  # still wedged (not ours to kill): restart, retry
            self._restart()
            result = self._exec_once(cmd, timeout, env)
        assert result is not None
        return result

    def _try_exec_once(
        self, cmd: str, timeout: float, env: dict[str, str] | None
    ) -> ExecResult | None:
        try:
            return self._exec_once(cmd, timeout, env)
        except SandboxError:
            return None

    def _exec_once(self, cmd: str, timeout: float, env: dict[str, str] | None) -> ExecResult:
        api = self.client.api
        seconds = str(max(1, int(timeout + 0.999)))
        if self._root:
            wrapped = ["sh", "-c", _ROOT_WRAPPER, _WRAPPER_NAME, seconds, cmd, self._keep]
        else:
            wrapped = ["sh", "-c", _EXEC_WRAPPER, _WRAPPER_NAME, seconds, cmd]
        environment = {"HOME": "/tmp", "LANG": "C.UTF-8", **self.spec.env, **(env or {})}
        cap = self.spec.limits.output_bytes
        out, err = HeadTail(cap), HeadTail(cap)
        start = time.monotonic()
        try:
            eid = api.exec_create(
                self.container.id,
                wrapped,
                user="0:0" if self._root else self._user,
                workdir=self.spec.mount_at,
                environment=environment,
            )["Id"]
            stream = api.exec_start(eid, stream=True, demux=True)
        except Exception as e:
            raise SandboxError(f"exec failed in container {self.container.id[:12]}: {e}") from e

        broke: list[BaseException] = []
        ends = [b"", b""]  # the last bytes of stdout and stderr: where the trailers are

        def pump() -> None:
            try:
                for o, e in stream:
                    if o:
                        out.feed(o)
                        ends[0] = (ends[0] + o)[-64:]
                    if e:
                        err.feed(e)
                        ends[1] = (ends[1] + e)[-64:]
            except Exception as exc:  # the engine dropped the stream: the output is incomplete
                broke.append(exc)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t.join(timeout + 10)
        hung = t.is_alive()
        duration = time.monotonic() - start
        code = -1
        for _ in range(50):  # poll the exit code (podman: detach + poll, not wait)
            info = api.exec_inspect(eid)
            if not info.get("Running"):
                code = -1 if info.get("ExitCode") is None else int(info["ExitCode"])
                break
            time.sleep(0.1)
        trailers = [_TRAILER_RE.search(end) for end in ends]
        for buf, m in zip((out, err), trailers, strict=True):
            if m:
                buf.drop_end(len(m.group(0)))
        if code == -1 and trailers[0]:  # the engine has no exit code; the wrapper said it
            code = int(trailers[0].group(1))
        timed_out = hung or (code in (124, 137) and duration >= timeout - 0.5)
        if timed_out or code == -1 or broke:
            self._kill_leftovers()
        lost = repr(broke[0]) if broke else ""
        if not lost and not all(trailers) and not _no_wrapper(code, err.text()):
            missing = "stdout" if not trailers[0] else "stderr"
            lost = f"exit code {code} but no end-of-output trailer on {missing}"
        output_lost = bool(lost) and not timed_out
        if output_lost:  # the command ran (it may have had effects): flagged, never rerun
            log.warning(
                "exec in container %s: the engine lost the command's output (%s; %d bytes "
                "arrived); the result says output_lost",
                self.container.id[:12],
                lost,
                out.total + err.total,
            )
        return ExecResult(
            exit_code=137 if timed_out else code,
            stdout=out.text(),
            stderr=err.text(),
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            oom_killed=(code == 137 and not timed_out),
            duration_s=round(duration, 4),
            output_lost=output_lost,
        )

    def _try_exec(self, cmd: list[str], user: str, polls: int = 100) -> int | None:
        """Run `cmd` to completion; its exit code, or None when it could not run."""
        api = self.client.api
        try:
            eid = api.exec_create(self.container.id, cmd, user=user)["Id"]
            api.exec_start(eid)
            for _ in range(polls):  # podman may return from exec_start early: poll
                info = api.exec_inspect(eid)
                if not info.get("Running"):
                    code = info.get("ExitCode")
                    return None if code is None else int(code)
                time.sleep(0.05)
        except Exception:
            return None
        return None

    def _kill_leftovers(self) -> None:
        """No process outlives its exec (as with the local backend): SIGKILL every uid-65534
        process (retried: the exec itself may not start while a fork bomb holds the pids);
        when that never works, restart the container."""
        kill = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do kill -9 -1 2>/dev/null; done; true"]
        for _ in range(5):
            if self._try_exec(kill, self._user) == 0:
                return
            time.sleep(0.1)
        self._restart()

    def _restart(self) -> None:
        """Kill the whole container (all its processes) and start it again on the same
        filesystem; wait until it accepts execs."""
        with contextlib.suppress(Exception):
            self.container.kill()
        for _ in range(100):  # poll, not wait (podman)
            with contextlib.suppress(Exception):
                self.container.reload()
                if self.container.status != "running":
                    break
            time.sleep(0.1)
        try:
            self.container.start()
        except Exception as e:
            raise SandboxError(f"container {self.container.id[:12]} did not restart: {e}") from e
        for _ in range(100):  # until the restarted container accepts execs again
            if self._try_exec(["true"], self._user, polls=40) == 0:
                self._find_main()
                return
            time.sleep(0.1)
        raise SandboxError(f"container {self.container.id[:12]} accepts no exec after a restart")

    def _inside(self, path: str) -> str:
        p = PurePosixPath(path)
        return str(p if p.is_absolute() else PurePosixPath(self.spec.mount_at) / p)

    def put_file(self, path: str, data: bytes) -> None:
        """Write as the agent's user (never root): the bytes are staged root-owned under a
        random name in a root-only directory, copied to `path` by an exec as uid 65534 (which
        cannot write where the agent cannot), and the stage is removed."""
        target = self._inside(path)
        name = f"{uuid.uuid4().hex}.in"
        self._root_exec(["sh", "-c", f"mkdir -p {_STAGE} && chmod 711 {_STAGE}"])
        self.container.put_archive(_STAGE, _tar_of({name: (data, 0o644)}, [], uid=0))
        try:
            r = self._raw_exec(
                [
                    "sh",
                    "-c",
                    'mkdir -p "$(dirname "$1")" && cat "$2" > "$1"',
                    "sh",
                    target,
                    f"{_STAGE}/{name}",
                ],
            )
        finally:
            self._root_exec(["rm", "-f", f"{_STAGE}/{name}"])
        if r[0] != 0:
            err = r[2].decode("utf-8", "replace").strip()
            raise SandboxError(f"put_file({path!r}) failed: {err}")

    def get_file(self, path: str) -> bytes | None:
        """Read as the agent's user: only regular files it may read (no root-only files, no
        FIFOs or devices), at most 256 MiB. The bytes end with a trailer: a read the engine
        lost (podman #21741: exit 0, no output) is retried, never returned as an empty file."""
        script = '[ -f "$1" ] || exit 3; head -c 268435456 -- "$1" || exit 1; rc=0; ' + _TRAILER
        for _ in range(3):
            code, out, _ = self._raw_exec(["sh", "-c", script, "sh", self._inside(path)])
            if code != 0:
                return None
            m = _TRAILER_RE.search(out[-64:])
            if m:
                return out[: len(out) - len(m.group(0))]
        raise ExecOutputLost(
            f"get_file({path!r}) in container {self.container.id[:12]}: the engine returned "
            "no end-of-output trailer 3 times (podman #21741: exec output lost with exit 0)"
        )

    def _raw_exec(self, cmd: list[str], timeout: float = 60) -> tuple[int, bytes, bytes]:
        """(exit code, stdout, stderr) of `cmd` run as uid 65534, bytes untouched; recovers
        a wedged container as `exec` does (kill leftovers, then restart) when it cannot start."""
        r = self._try_raw_exec(cmd, timeout)
        if r is None:  # e.g. pids exhausted: kill what is left, retry
            self._kill_leftovers()
            r = self._try_raw_exec(cmd, timeout)
        if r is None:  # still wedged (a process not ours to kill): restart, retry
            self._restart()
            r = self._raw_exec_once(cmd, timeout)
        return r

    def _try_raw_exec(self, cmd: list[str], timeout: float) -> tuple[int, bytes, bytes] | None:
        try:
            r = self._raw_exec_once(cmd, timeout)
        except SandboxError:
            return None
        code, out, err = r
        text = err.decode("utf-8", "replace")
        if out or code == 0:
            return r
        if any(m in text for m in _NO_FORK):
            return None  # our own script could not fork its steps (pids exhausted): not run
        if code in (125, 126) and any(m in text for m in _RUNTIME_FAILURE):
            return None  # the command never ran
        return r

    def _raw_exec_once(self, cmd: list[str], timeout: float) -> tuple[int, bytes, bytes]:
        api = self.client.api
        wrapped = ["timeout", "-k", "2", str(int(timeout)), *cmd]
        try:
            eid = api.exec_create(
                self.container.id, wrapped, user=self._user, workdir=self.spec.mount_at
            )["Id"]
            out, err = api.exec_start(eid, demux=True)
        except Exception as e:
            raise SandboxError(f"exec failed in container {self.container.id[:12]}: {e}") from e
        for _ in range(100):  # podman: poll for the exit code
            info = api.exec_inspect(eid)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return -1 if code is None else int(code), out or b"", err or b""
            time.sleep(0.05)
        return -1, out or b"", err or b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.container.remove(force=True)

    def __enter__(self) -> DockerSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DockerExecutor:
    backend = Backend.DOCKER

    def __init__(self, base_url: str | None = None, image: str = DEFAULT_IMAGE) -> None:
        import docker

        self.client = docker.DockerClient(base_url=base_url or ensure_podman_socket(), timeout=120)
        self.image = image

    def open(self, spec: SessionSpec) -> DockerSession:
        return DockerSession(self.client, spec, self.image)

    def cleanup(self) -> int:
        """Remove every container this backend started, whoever owns it; returns how many.
        (`sandbox.pool.cleanup_orphans` removes only those of dead owners.)"""
        n = 0
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
            with contextlib.suppress(Exception):
                c.remove(force=True)
                n += 1
        return n
