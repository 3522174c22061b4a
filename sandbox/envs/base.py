"""The shape every ThunderSync environment shares, and the sandbox sessions they draw from.

`SessionEnv` (every env): the sandbox session and the step outputs.
- Sessions come from the process-wide `SandboxPool` of the env's backend (`session_pool`): one
  pool per backend name, made on first use; `acquire_session(spec)` leases one (a warm idle
  session opened for an equal `SessionSpec` when there is one), `release_session()` / `close()`
  give it back: the pool resets it and hands it to the next env asking for that spec.
- An env given `extras["executor"]` (tests, `tsrl env check`) draws from a process-wide pool
  over that executor object instead, so the session path is the same; like the backend pools it
  lives until the process exits (its atexit hook closes every session).
- Pool size: `TSRL_POOL_SIZE` (default 16), grown to `extras["pool_size"]` when an env
  asks for more; the catalogue passes the run's `rollout.concurrency`, so a pool is never smaller
  than the concurrency of a run using it, and that run's envs (each holding at most one lease)
  never wait for one another.
- `observe(text)` / `done(reward, metadata)` build the step outputs.

`ToolEnv` (the sandbox tool envs: SWE-smith, terminal) owns the episode around the tool format of
`sandbox.envs.tools`: `init` gives back the last episode's session, opens the episode's one and
resets the turn count; `step` counts the turn, parses the action, runs the tool or turns a
`ToolCallError` into an `error: ...` observation (marked `malformed_tool_call`), and ends the
episode on `submit` or at `max_turns` with the subclass's `finish` (metadata["end"] says which).
A subclass provides `prompt`, `open_session`, `start` (the init metadata) and `finish` (the
reward and the final metadata).

extras every env reads: `backend` ("local" | "docker", default local), `executor`, `pool_size`;
`ToolEnv` also `max_turns` (30) and `tool_timeout` (60 s).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from thundersync.sandbox.envs.tools import Tool, ToolCallError, parse_action, run_tool
from thundersync.sandbox.executor import Executor, Session, SessionSpec
from thundersync.sandbox.pool import SandboxPool

DEFAULT_POOL_SIZE = 16
POOL_SIZE_ENV = "TSRL_POOL_SIZE"

_POOLS: dict[Any, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_size(requested: int | None = None) -> int:
    """`TSRL_POOL_SIZE` (default 16), or `requested` when that is more."""
    base = int(os.environ.get(POOL_SIZE_ENV) or DEFAULT_POOL_SIZE)
    return max(1, base, requested or 0)


def session_pool(backend: str | Executor = "local", size: int | None = None) -> SandboxPool:
    """The process-wide pool for a backend name (or for one executor object), at least `size`
    sessions big."""
    key: Any = str(backend) if isinstance(backend, str) else ("executor", id(backend))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            # a pool keeps its executor alive, so an id() key cannot be reused while it is here
            pool = _POOLS[key] = SandboxPool(backend, max_sessions=pool_size(size))
        else:
            pool.grow(pool_size(size))
        return pool


class SessionEnv(BaseTextEnv):
    """A skyrl-gym text env whose sandbox session comes from a pool (see the module doc)."""

    def __init__(self, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.backend: str | Executor = extras.get("executor") or str(extras.get("backend", "local"))
        size = extras.get("pool_size")
        self.pool_size = int(size) if size is not None else None
        self.session: Session | None = None

    @property
    def pool(self) -> SandboxPool:
        return session_pool(self.backend, self.pool_size)

    def acquire_session(self, spec: SessionSpec) -> Session:
        """Lease a session for `spec` (giving back the one held, if any)."""
        self.release_session()
        self.session = self.pool.acquire(spec)
        return self.session

    def release_session(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            session.close()  # a pooled session goes back to its pool, reset

    def close(self) -> None:
        self.release_session()

    @staticmethod
    def observe(text: str, *, done: bool = False, malformed: bool = False) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": text}],
            reward=0.0,
            done=done,
            metadata={"malformed_tool_call": malformed},
        )

    @staticmethod
    def done(reward: float, metadata: dict[str, Any]) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)


class ToolEnv(SessionEnv):
    """An episode of sandbox tool calls ending in a verified reward (see the module doc)."""

    def __init__(self, extras: dict[str, Any] | None = None) -> None:
        super().__init__(extras)
        extras = extras or {}
        self.max_turns = int(extras.get("max_turns", 30))
        self.tool_timeout = float(extras.get("tool_timeout", 60))

    # ---- what a subclass provides -------------------------------------------------------------
    def prompt(self) -> ConversationType:
        raise NotImplementedError

    def open_session(self) -> Session:
        """Lease the episode's session (usually `self.acquire_session(spec)`)."""
        raise NotImplementedError

    def start(self) -> dict[str, Any]:
        """Reset the subclass's episode state; returns the metadata of `init`."""
        return {}

    def finish(self, note: str) -> tuple[float, dict[str, Any]]:
        """The episode's reward and final metadata; `note` is "submit" or "max_turns"."""
        raise NotImplementedError

    # ---- the shared episode -------------------------------------------------------------------
    def init(
        self, prompt: ConversationType | None = None
    ) -> tuple[ConversationType, dict[str, Any]]:
        self.release_session()
        self.session = self.open_session()
        self.turns = 0
        return (prompt or self.prompt()), self.start()

    def _finish(self, note: str) -> BaseTextEnvStepOutput:
        reward, metadata = self.finish(note)
        return self.done(reward, metadata | {"end": note})

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.session is None:
            raise RuntimeError("call init() before step()")
        self.turns += 1
        malformed = False
        try:
            call = parse_action(action)
            if call.tool is Tool.SUBMIT:
                return self._finish("submit")
            obs = run_tool(self.session, call, self.tool_timeout)
        except ToolCallError as e:
            obs, malformed = f"error: {e}", True
        if self.turns >= self.max_turns:
            return self._finish("max_turns")
        return self.observe(obs, malformed=malformed)
