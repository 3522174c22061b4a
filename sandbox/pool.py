"""A pool of sandbox sessions: pre-warmed, reset between uses, bounded, cleaned up.

    with SandboxPool("docker", max_sessions=8) as pool:
        pool.prewarm(spec, 4)                     # open 4 sessions for `spec` now
        with pool.acquire(spec) as s:             # a warm session (opened if none is idle)
            s.exec("pytest -q")
        # back in the pool: reset (task dir re-copied, nothing the command wrote or started
        # survives) and handed to the next acquire of the same spec

- Sessions are keyed by (backend, spec): an acquire only gets a session opened for an equal
  `SessionSpec`.
- At most `max_sessions` sessions are leased at once (a semaphore) and at most `max_sessions`
  are open at all (idle sessions of other specs are closed to make room). An acquire beyond the
  bound waits for a release; after `acquire_timeout` it raises `PoolExhausted`, whose message says
  what to raise. `grow(n)` raises the bound of a live pool.
- A lease is a `Session`: `close()` on it returns the session to the pool (so environments that
  close their session work unchanged). A session whose reset fails, or that is released with
  `discard=True`, is closed instead of reused.
- Exit: `close()` (the context manager, and an `atexit` hook) closes every session. Crash: every
  local session directory and docker container names its owner (pid + start time, see
  `sandbox.owner`); `sandbox.orphans.cleanup_orphans()` removes the leftovers of dead owners - a
  pool runs it for its backend when it starts, so a restarted worker cleans up after the one
  that was SIGKILLed.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from dataclasses import astuple
from typing import Any

from thundersync.sandbox.backends import get_executor
from thundersync.sandbox.executor import Backend, ExecResult, Executor, SandboxError, SessionSpec
from thundersync.sandbox.orphans import cleanup_orphans


class PoolExhausted(SandboxError, TimeoutError):
    """No session became free within the acquire timeout."""


def spec_key(backend: Backend | str, spec: SessionSpec) -> tuple[Any, ...]:
    """Hashable identity of (backend, spec): sessions are only reused for an equal spec."""
    return (
        str(Backend(backend)),
        str(spec.workdir) if spec.workdir is not None else None,
        spec.mount_at,
        spec.image,
        spec.network,
        astuple(spec.limits),
        tuple(sorted(spec.env.items())),
        spec.label,
        tuple(spec.scratch),
        spec.exec_user,
    )


class PooledSession:
    """A leased session; `close()` (or leaving the `with` block) gives it back to the pool."""

    def __init__(self, pool: SandboxPool, key: tuple[Any, ...], session: Any) -> None:
        self._pool, self._key, self._session = pool, key, session
        self._released = False
        self.discard = False  # set True to have the session closed instead of reused

    @property
    def session(self) -> Any:
        if self._released:
            raise SandboxError("this pooled session was released; acquire another one")
        return self._session

    @property
    def workdir_inside(self) -> str:
        return str(self.session.workdir_inside)

    def exec(
        self, cmd: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> ExecResult:
        try:
            result: ExecResult = self.session.exec(cmd, timeout, env)
        except SandboxError:
            self.discard = True  # a broken sandbox is not handed to the next user
            raise
        return result

    def put_file(self, path: str, data: bytes) -> None:
        self.session.put_file(path, data)

    def get_file(self, path: str) -> bytes | None:
        data: bytes | None = self.session.get_file(path)
        return data

    def reset(self) -> None:
        self.session.reset()

    def close(self) -> None:
        self.release()

    def release(self, discard: bool = False) -> None:
        if self._released:
            return
        self._released = True
        self._pool._release(self._key, self._session, discard or self.discard)

    def __enter__(self) -> PooledSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SandboxPool:
    def __init__(
        self,
        backend: Backend | str | Executor = "local",
        max_sessions: int = 4,
        acquire_timeout: float = 300.0,
        cleanup_orphans_on_start: bool = True,
        **executor_kwargs: Any,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if isinstance(backend, (str, Backend)):
            self.executor: Executor = get_executor(backend, **executor_kwargs)
        else:
            self.executor = backend
        self.backend = Backend(self.executor.backend)
        self.max_sessions = max_sessions
        self.acquire_timeout = acquire_timeout
        self._slots = threading.Semaphore(max_sessions)  # a plain one: grow() adds permits
        self._lock = threading.Lock()
        self._idle: dict[tuple[Any, ...], list[Any]] = {}
        self._leased: set[int] = set()
        self._leased_sessions: dict[int, Any] = {}
        self._opened = 0  # sessions currently open (idle + leased)
        self._closed = False
        self.stats = {"opened": 0, "reused": 0, "reset_failed": 0, "closed": 0}
        if cleanup_orphans_on_start:
            base = getattr(self.executor, "base", None)
            with contextlib.suppress(Exception):
                if self.backend is Backend.LOCAL:
                    cleanup_orphans(base_dir=base, docker=False)
                else:
                    cleanup_orphans(
                        base_dir=base,
                        local=False,
                        docker_client=getattr(self.executor, "client", None),
                    )
        ref = weakref.ref(self)

        def _close_at_exit() -> None:
            pool = ref()
            if pool is not None:
                pool.close()

        self._atexit = _close_at_exit
        atexit.register(self._atexit)

    # ---- sizes ------------------------------------------------------------------------------
    def idle_count(self, spec: SessionSpec | None = None) -> int:
        with self._lock:
            if spec is None:
                return sum(len(v) for v in self._idle.values())
            return len(self._idle.get(spec_key(self.backend, spec), []))

    @property
    def leased_count(self) -> int:
        with self._lock:
            return len(self._leased)

    @property
    def open_count(self) -> int:
        with self._lock:
            return self._opened

    @property
    def closed(self) -> bool:
        return self._closed

    def grow(self, max_sessions: int) -> None:
        """Raise the bound to `max_sessions` (waiting acquires get the new slots at once); a
        smaller number changes nothing."""
        with self._lock:
            extra = max_sessions - self.max_sessions
            if extra <= 0:
                return
            self.max_sessions = max_sessions
        self._slots.release(extra)

    # ---- warm-up ----------------------------------------------------------------------------
    def prewarm(self, spec: SessionSpec, n: int) -> int:
        """Open sessions for `spec` until `n` are idle (never more than `max_sessions` open);
        returns how many are idle for it now."""
        key = spec_key(self.backend, spec)
        while True:
            with self._lock:
                self._check_open()
                have = len(self._idle.get(key, []))
                if have >= n or self._opened >= self.max_sessions:
                    return have
                self._opened += 1
            try:
                session = self.executor.open(spec)
            except BaseException:
                with self._lock:
                    self._opened -= 1
                raise
            with self._lock:
                self.stats["opened"] += 1
                self._idle.setdefault(key, []).append(session)

    # ---- leasing ----------------------------------------------------------------------------
    def acquire(self, spec: SessionSpec, timeout: float | None = None) -> PooledSession:
        """A session for `spec`: an idle warm one, else a new one. Waits while `max_sessions`
        are leased; raises `PoolExhausted` after `timeout` (default: the pool's)."""
        self._check_open()
        wait = self.acquire_timeout if timeout is None else timeout
        start = time.monotonic()
        if not self._slots.acquire(timeout=wait):
            raise PoolExhausted(
                f"no sandbox session free after {time.monotonic() - start:.1f}s: all "
                f"{self.max_sessions} sessions of the {self.backend.value} pool are leased. "
                f"Raise SandboxPool(max_sessions=...) (now {self.max_sessions}) if the host has "
                f"room for more sandboxes, or acquire_timeout (now {wait:g}s) if leases are just "
                "long; and make sure every lease is released (`with pool.acquire(spec) as s:`)."
            )
        key = spec_key(self.backend, spec)
        try:
            session, evict = None, None
            with self._lock:
                self._check_open()
                idle = self._idle.get(key)
                if idle:
                    session = idle.pop()
                    self.stats["reused"] += 1
                else:
                    if self._opened >= self.max_sessions:  # make room: close an idle one
                        evict = self._pop_any_idle()
                    else:
                        self._opened += 1
                if session is not None:
                    self._lease(session)
            if session is None:
                if evict is not None:
                    self._close_session(evict, count=False)  # its slot goes to the new one
                try:
                    session = self.executor.open(spec)
                except BaseException:
                    with self._lock:
                        self._opened -= 1
                    raise
                with self._lock:
                    self.stats["opened"] += 1
                    self._lease(session)
        except BaseException:
            self._slots.release()
            raise
        return PooledSession(self, key, session)

    def _lease(self, session: Any) -> None:
        self._leased.add(id(session))
        self._leased_sessions[id(session)] = session

    def _pop_any_idle(self) -> Any:
        for k, sessions in self._idle.items():
            if sessions:
                s = sessions.pop(0)
                if not sessions:
                    del self._idle[k]
                return s
        raise RuntimeError("pool accounting: max_sessions open but none idle while a slot is free")

    def _release(self, key: tuple[Any, ...], session: Any, discard: bool) -> None:
        try:
            with self._lock:
                self._leased.discard(id(session))
                self._leased_sessions.pop(id(session), None)
                closed = self._closed
            if not (discard or closed):
                try:
                    session.reset()
                except Exception:
                    self.stats["reset_failed"] += 1
                    discard = True
            if discard or closed:
                self._close_session(session)
                return
            with self._lock:
                if self._closed:
                    closing = True
                else:
                    closing = False
                    self._idle.setdefault(key, []).append(session)
            if closing:
                self._close_session(session)
        finally:
            self._slots.release()

    def _close_session(self, session: Any, count: bool = True) -> None:
        with contextlib.suppress(Exception):
            session.close()
        with self._lock:
            self.stats["closed"] += 1
            if count:
                self._opened -= 1

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")

    # ---- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close every session, idle and leased (leases become unusable)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = [s for v in self._idle.values() for s in v]
            sessions += list(self._leased_sessions.values())
            self._idle.clear()
            self._leased_sessions.clear()
        for s in sessions:
            self._close_session(s)
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
