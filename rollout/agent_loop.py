"""The multi-turn agent loop: prompt -> action -> tool call in the sandbox -> observation -> ...

One asyncio task per trajectory. Generation and tool calls run in two separate thread pools, so a
slow `env.step` (a sandboxed shell command, a test run) never stops other trajectories from
generating. The environment (any skyrl-gym `BaseTextEnv`) parses the tool call out of the action
text; a malformed call comes back as an error observation and is counted when the env marks it in
`metadata` (`malformed_tool_call: True`, see docs/CONTRACTS.md). A trajectory ends when the env
says done (submit), after `max_turns`, or when the token budget is spent; the done step's
metadata becomes the trajectory's (`Trajectory.metadata`: e.g. a terminal env's named `scores`).

When a teacher is given (OPD), each turn's action is scored while its tool call runs, and
`on_turn_completed` fires as soon as the action tokens (and their teacher scores) are fixed: that
is the turn's ready time for the learner. `on_reward_ready` fires when the trajectory's reward is
known, `on_trajectory_completed` right after. Each score names its trajectory (`key=task.ref`) and
the teacher's `release(ref)` runs when the trajectory ends, however it ends, so an incremental
teacher keeps K/V only for open trajectories.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from thundersync.rollout.chat import Messages, TokenizerChatFormat
from thundersync.rollout.inference_engine import InferenceEngine
from thundersync.rollout.replicas import Router
from thundersync.rollout.trajectory import Trajectory, TrajectoryRef, Turn
from thundersync.rollout.types import SamplingParams


class RolloutCallbacks(Protocol):
    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None: ...

    def on_trajectory_completed(self, traj: Trajectory) -> None: ...

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None: ...


class NullCallbacks:
    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        pass

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        pass

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        pass


class TurnScorer(Protocol):
    """What the loop needs from a teacher: log-probs of ids[start:] given ids[:start], `key`
    naming the trajectory, and `release(key)` once it ends. Older scorers with neither (a plain
    `score(token_ids, start)`) still work: the loop checks for them once."""

    def score(
        self, token_ids: Sequence[int], start: int, *, key: Hashable | None = None
    ) -> list[float]: ...

    def release(self, key: Hashable) -> None: ...


def _takes_key(teacher: object) -> bool:
    try:
        params = inspect.signature(teacher.score).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
    return "key" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass
class RolloutTask:
    """One trajectory to run: a fresh env from `make_env`, its initial messages."""

    instance_id: str
    make_env: Callable[[], Any]  # -> skyrl_gym BaseTextEnv
    prompt: Messages
    repetition: int = 0
    seed: int = 0

    @property
    def ref(self) -> TrajectoryRef:
        return TrajectoryRef(self.instance_id, self.repetition)


@dataclass
class AgentLoopConfig:
    max_turns: int = 4
    max_total_tokens: int = 2048
    sampling: SamplingParams = field(default_factory=SamplingParams)
    concurrency: int = 4
    tool_workers: int = 4


def _is_malformed(metadata: dict[str, Any] | None) -> bool:
    md = metadata or {}
    return bool(md.get("malformed_tool_call") or md.get("malformed"))


class AgentLoop:
    def __init__(
        self,
        engine: InferenceEngine,
        chat: TokenizerChatFormat,
        config: AgentLoopConfig | None = None,
        callbacks: RolloutCallbacks | None = None,
        teacher: TurnScorer | None = None,
    ) -> None:
        self.engine = engine
        self.chat = chat
        self.config = config or AgentLoopConfig()
        self.callbacks: RolloutCallbacks = callbacks or NullCallbacks()
        self.teacher = teacher
        self._keyed = teacher is not None and _takes_key(teacher)
        release = getattr(teacher, "release", None)
        self._release: Callable[[Hashable], None] | None = release if callable(release) else None

    def run(self, tasks: Sequence[RolloutTask], version: int | None = None) -> list[Trajectory]:
        """Run every task to completion (results in task order)."""
        return asyncio.run(self.arun(tasks, version))

    async def arun(
        self, tasks: Sequence[RolloutTask], version: int | None = None
    ) -> list[Trajectory]:
        cfg = self.config
        sem = asyncio.Semaphore(cfg.concurrency)
        with (
            ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="gen") as gen_pool,
            ThreadPoolExecutor(cfg.tool_workers, thread_name_prefix="tool") as tool_pool,
        ):

            async def one(task: RolloutTask) -> Trajectory:
                async with sem:
                    return await self._trajectory(task, version, gen_pool, tool_pool)

            return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def _trajectory(
        self,
        task: RolloutTask,
        version: int | None,
        gen_pool: ThreadPoolExecutor,
        tool_pool: ThreadPoolExecutor,
    ) -> Trajectory:
        loop = asyncio.get_running_loop()
        cfg = self.config
        env = await loop.run_in_executor(tool_pool, task.make_env)
        router = self.engine if isinstance(self.engine, Router) else None
        try:
            init_msgs, _ = await loop.run_in_executor(tool_pool, env.init, task.prompt)
            prompt_ids = self.chat.prompt_ids(list(init_msgs))
            traj = Trajectory(
                trajectory_id=str(task.ref),
                instance_id=task.instance_id,
                repetition=task.repetition,
                prompt_ids=prompt_ids,
                start=time.time(),
            )
            context = list(prompt_ids)
            # with several replicas, every turn of this trajectory goes to the same one
            engine = router.route(str(task.ref)) if router is not None else self.engine
            reward = 0.0
            traj.stop_reason = "max_turns"
            for turn_idx in range(cfg.max_turns):
                budget = cfg.max_total_tokens - len(context)
                if budget <= 0:
                    traj.stop_reason = "token_budget"
                    break
                params = cfg.sampling
                if budget < params.max_new_tokens:
                    params = SamplingParams(
                        budget, params.temperature, params.top_p, params.stop_token_ids
                    )
                seed = task.seed * 1_000_003 + task.repetition * 1009 + turn_idx
                t0 = time.time()
                gen = await loop.run_in_executor(
                    gen_pool,
                    functools.partial(
                        engine.generate, list(context), params, seed, version=version
                    ),
                )
                turn = Turn(
                    index=turn_idx,
                    context_len=len(context),
                    action_ids=gen.token_ids,
                    action_logprobs=gen.logprobs,
                    version=gen.version,
                    finish_reason=gen.finish_reason,
                    action_text=self.chat.decode(gen.token_ids),
                    gen_start=t0,
                    gen_end=time.time(),
                )
                traj.turns.append(turn)
                context += gen.token_ids
                turn.tool_start = time.time()
                step_fut = loop.run_in_executor(tool_pool, env.step, turn.action_text)
                if self.teacher is not None:
                    await self._score_turn(turn, list(context), gen_pool, task.ref)
                self.callbacks.on_turn_completed(traj, turn)
                out = await step_fut
                turn.tool_end = time.time()
                turn.reward = float(out.get("reward") or 0.0)
                reward += turn.reward
                turn.malformed = _is_malformed(out.get("metadata"))
                traj.malformed_calls += int(turn.malformed)
                if out.get("done"):
                    traj.stop_reason = "done"
                    traj.metadata = dict(out.get("metadata") or {})
                    break
                obs = list(out.get("observations") or [])
                for m in obs:
                    m["content"], cut = self.chat.truncate(str(m.get("content", "")))
                    turn.obs_truncated |= cut
                turn.observation_text = "\n".join(m["content"] for m in obs)
                turn.obs_ids = self.chat.observation_ids(obs) if obs else []
                context += turn.obs_ids
                if len(context) >= cfg.max_total_tokens:
                    traj.stop_reason = "token_budget"
                    break
            traj.reward = reward
            traj.end = time.time()
            self.callbacks.on_reward_ready(traj, reward)
            self.callbacks.on_trajectory_completed(traj)
            return traj
        finally:
            if router is not None:
                router.release(str(task.ref))
            try:
                if self._release is not None:  # closed or aborted: free its teacher cache
                    await loop.run_in_executor(gen_pool, self._release, task.ref)
            finally:
                await loop.run_in_executor(tool_pool, env.close)

    async def _score_turn(
        self, turn: Turn, context: list[int], pool: ThreadPoolExecutor, ref: TrajectoryRef
    ) -> None:
        assert self.teacher is not None
        loop = asyncio.get_running_loop()
        turn.teacher_start = time.time()
        teacher, keyed = self.teacher, self._keyed
        turn.teacher_logprobs = await loop.run_in_executor(
            pool,
            lambda: (
                teacher.score(context, turn.context_len, key=ref)
                if keyed
                else teacher.score(context, turn.context_len)
            ),
        )
        turn.teacher_end = time.time()
