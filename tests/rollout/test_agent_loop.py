"""The agent loop drives a skyrl-gym env: token layout, callbacks, malformed calls, async tools."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from thundersync.hf_models import load_tokenizer
from thundersync.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
from thundersync.rollout.chat import TokenizerChatFormat, truncate_head_tail
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.trajectory import (
    Trajectory,
    Turn,
    from_generator_output,
    to_generator_output,
)
from thundersync.rollout.types import SamplingParams
from thundersync.sandbox.envs.calc_env import ToyCalcEnv

PROMPT = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path) -> TokenizerChatFormat:
    return TokenizerChatFormat(load_tokenizer(tiny_model_dir), max_obs_tokens=16)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def on_turn_completed(self, traj: Trajectory, turn: Turn) -> None:
        self.events.append(("turn", traj.trajectory_id, turn.index))

    def on_trajectory_completed(self, traj: Trajectory) -> None:
        self.events.append(("traj", traj.trajectory_id, len(traj.turns)))

    def on_reward_ready(self, traj: Trajectory, reward: float) -> None:
        self.events.append(("reward", traj.trajectory_id, len(traj.turns)))


def _tasks(n: int, make_env: Any = None) -> list[RolloutTask]:
    mk = make_env or (lambda: ToyCalcEnv(extras={"answer": "5", "max_turns": 3}))
    return [RolloutTask(f"t{i}", mk, PROMPT, repetition=i, seed=1) for i in range(n)]


def test_trajectory_token_layout_mask_and_logprobs_line_up(
    engine: HFEngine, chat: TokenizerChatFormat
) -> None:
    cfg = AgentLoopConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=6))
    rec = Recorder()
    trajs = AgentLoop(engine, chat, cfg, callbacks=rec).run(_tasks(3))
    for tr in trajs:
        n = len(tr.response_ids)
        assert len(tr.loss_mask) == n == len(tr.rollout_logprobs)
        assert sum(tr.loss_mask) == sum(len(t.action_ids) for t in tr.turns)
        full = tr.prompt_ids + tr.response_ids
        for t in tr.turns:
            assert full[t.context_len : t.context_len + len(t.action_ids)] == t.action_ids
            assert t.gen_start <= t.gen_end <= (t.tool_end or t.gen_end)
            assert t.version == 0
        assert tr.stop_reason in ("done", "max_turns", "token_budget")
        assert tr.reward is not None
        # the random tiny model never writes a valid tool call: every turn is counted malformed
        assert tr.malformed_calls == sum(t.malformed for t in tr.turns) >= 1
        kinds = [e[0] for e in rec.events if e[1] == tr.trajectory_id]
        assert kinds == ["turn"] * len(tr.turns) + ["reward", "traj"]


def test_token_budget_ends_the_trajectory(engine: HFEngine, chat: TokenizerChatFormat) -> None:
    cfg = AgentLoopConfig(max_turns=50, max_total_tokens=40, sampling=SamplingParams(8))
    (tr,) = AgentLoop(engine, chat, cfg).run(
        _tasks(1, lambda: ToyCalcEnv(extras={"answer": "5", "max_turns": 50}))
    )
    assert tr.stop_reason == "token_budget"
    assert len(tr.prompt_ids) + sum(len(t.action_ids) for t in tr.turns) <= 40


def test_tool_calls_of_different_trajectories_run_concurrently(
    engine: HFEngine, chat: TokenizerChatFormat
) -> None:
    # Both envs block in step() until the other one is in step() too: only a loop that runs
    # tool calls asynchronously, side by side, gets past this barrier.
    barrier = threading.Barrier(2, timeout=60)

    class BlockingEnv(ToyCalcEnv):
        def step(self, action: str) -> Any:
            barrier.wait()
            return super().step(action)

    cfg = AgentLoopConfig(max_turns=1, sampling=SamplingParams(4), concurrency=2, tool_workers=2)
    trajs = AgentLoop(engine, chat, cfg).run(_tasks(2, lambda: BlockingEnv(extras={"answer": "5"})))
    assert not barrier.broken and len(trajs) == 2


def test_teacher_scores_each_turn_while_the_tool_runs(
    engine: HFEngine, chat: TokenizerChatFormat
) -> None:
    class LenScorer:
        def score(self, token_ids: Any, start: int) -> list[float]:
            return [-1.0] * (len(token_ids) - start)

    cfg = AgentLoopConfig(max_turns=2, sampling=SamplingParams(5))
    (tr,) = AgentLoop(engine, chat, cfg, teacher=LenScorer()).run(_tasks(1))
    for t in tr.turns:
        assert t.teacher_logprobs == [-1.0] * len(t.action_ids)
        assert t.teacher_start is not None and t.teacher_end is not None


def test_generator_output_round_trip(engine: HFEngine, chat: TokenizerChatFormat) -> None:
    cfg = AgentLoopConfig(max_turns=2, sampling=SamplingParams(5))
    trajs = AgentLoop(engine, chat, cfg).run(_tasks(2))
    out = to_generator_output(trajs)
    assert set(out) >= {
        "prompt_token_ids",
        "response_ids",
        "rewards",
        "loss_masks",
        "rollout_logprobs",
        "trajectory_ids",
    }
    back = from_generator_output(out)
    assert to_generator_output(back)["response_ids"] == out["response_ids"]
    assert to_generator_output(back)["loss_masks"] == out["loss_masks"]
    assert to_generator_output(back)["rollout_logprobs"] == out["rollout_logprobs"]
    assert [t.instance_id for t in back] == ["t0", "t1"]


def test_long_observations_keep_head_and_tail(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    text = "first line " + "pass " * 200 + " last error"
    cut, was_cut = truncate_head_tail(text, tok, 20)
    assert was_cut and cut.startswith("first") and cut.endswith("error") and "truncated" in cut
    assert truncate_head_tail("short", tok, 20) == ("short", False)


def test_toy_env_rewards_a_correct_submission_and_flags_malformed_calls() -> None:
    env = ToyCalcEnv(extras={"answer": "5"})
    out = env.step("<tool>calc 2+3</tool>")
    assert out["observations"][0]["content"] == "5" and not out["done"]
    assert env.step("just text")["metadata"]["malformed_tool_call"]
    done = env.step("<tool>submit 5</tool>")
    assert done["done"] and done["reward"] == 1.0
