"""Exec and file plumbing of a docker session (`sandbox.docker_backend` owns its lifecycle).

Each exec is wrapped in coreutils `timeout` inside a small `sh` whose builtin `kill -9 -1`
(repeated, no fork needed) kills every process of the sandbox user when the command returns - no
process outlives its exec (setsid / daemonised children and fork bombs included); the host also
watches the exec and repeats the kill on a timeout. If an exec cannot even start (pids
exhausted), the session recovers: `kill -9 -1` from a fresh exec, retried, else a container
restart (same filesystem), then the exec is retried once. An exit of 137 that is not a timeout is
reported as oom_killed (the memory cgroup's OOM killer is the only other source of SIGKILL).
The file tools act as the agent's user through execs: they reach what its commands reach.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from pathlib import PurePosixPath
from typing import Any

from thundersync.sandbox.docker_support import _tar_of
from thundersync.sandbox.executor import ExecOutputLost, ExecResult, SandboxError, SessionSpec
from thundersync.sandbox.output import READ_CHECK, READ_HEAD, READ_MAX, HeadTail

log = logging.getLogger("thundersync.sandbox.docker_backend")  # the backend's, as before the split
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


class ContainerExec:
    """Runs commands and the file tools in `self.container`; `DockerSession` sets the fields."""

    client: Any
    container: Any
    spec: SessionSpec
    _root: bool  # execs run as uid 0 (verifiers)
    _user: str  # uid:gid of everything else
    _keep: str  # pid of `sleep infinity`: root execs' cleanup must spare it
    _closed: bool

    def _find_main(self) -> None:
        """Root sessions: note pid 1's only child (`sleep infinity`) so that the cleanup after a
        root exec kills everything else (a root `kill -9 -1` would stop the container)."""
        if not self._root:
            return
        with contextlib.suppress(Exception):
            code, out = self.container.exec_run(["cat", "/proc/1/task/1/children"], user="0")
            pids = out.decode().split() if code == 0 else []
            self._keep = pids[0] if len(pids) == 1 and pids[0].isdigit() else ""

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
            copy = 'mkdir -p "$(dirname "$1")" && cat "$2" > "$1"'
            r = self._raw_exec(["sh", "-c", copy, "sh", target, f"{_STAGE}/{name}"])
        finally:
            self._root_exec(["rm", "-f", f"{_STAGE}/{name}"])
        if r[0] != 0:
            err = r[2].decode("utf-8", "replace").strip()
            raise SandboxError(f"put_file({path!r}) failed: {err}")

    def get_file(self, path: str) -> bytes | None:
        """Read as the agent's user: only regular files it may read (no root-only files, no
        FIFOs, devices, /proc), at most READ_MAX bytes (None past it). The bytes end with a
        trailer: a read the engine lost (podman #21741: exit 0, no output) is retried."""
        script = f"{READ_CHECK}{READ_HEAD} || exit 1; rc=0; {_TRAILER}"
        for _ in range(3):
            code, out, _ = self._raw_exec(["sh", "-c", script, "sh", self._inside(path)])
            if code != 0:
                return None
            m = _TRAILER_RE.search(out[-64:])
            if m:
                data = out[: len(out) - len(m.group(0))]
                return data if len(data) <= READ_MAX else None
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
