from __future__ import annotations

import pytest
from bus_helpers import source
from pydantic import ValidationError

from thundersync.bus.events import (
    BarrierStats,
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    GrpoRewardReady,
    LearnerReady,
    OpdTurnReady,
    PolicyPublished,
    ReplicaAcked,
    Role,
    Span,
    TrajectoryRegistered,
    decode_event,
    encode_event,
)
from thundersync.bus.protocol import Topic, default_topic


def test_every_event_type_round_trips_through_json() -> None:
    events: list[Event] = [
        source(3),
        GrpoRewardReady(
            run_id="r",
            source_id="t3/reward",
            update=0,
            policy_version=0,
            group_id="g0",
            traj_id="t3",
            index=3,
            reward=0.5,
        ),
        OpdTurnReady(
            run_id="r",
            source_id="o1",
            update=1,
            policy_version=1,
            group_id="g",
            traj_id="t",
            turn=2,
            token_ids=[5, 6],
            action_mask=[0, 1],
            offset=7,
            teacher_logprobs=[0.0, -0.5],
        ),
        LearnerReady(run_id="r", rank=1, version=0),
        GroupRegistered(run_id="r", update=0, group_id="g", size=4, prompt_ids=[1, 2]),
        TrajectoryRegistered(run_id="r", update=0, traj_id="t"),
        GroupClosed(run_id="r", update=0, group_id="g", sources=4),
        BatchClosed(run_id="r", update=0, groups=2, sources=8),
        PolicyPublished(run_id="r", version=1, uri="file:///w"),
        ReplicaAcked(run_id="r", replica_id="rep0", version=1),
        BarrierStats(
            run_id="r",
            update=0,
            version=1,
            start=1.0,
            end=2.0,
            busy_s=0.5,
            reduce_s=0.1,
            step_s=0.1,
            publish_s=0.1,
            tokens=10,
            work_items=2,
            grad_norm=0.3,
            ready_to_recv_p99_ms=1.0,
            bus_p99_ms=0.2,
            peak_rss_mb=100.0,
            n_params=5,
            max_staleness=0,
        ),
        Span(
            run_id="r", update=0, role=Role.LEARNER, kind="backward", start=1.0, end=2.0, ready=0.5
        ),
    ]
    for ev in events:
        back = decode_event(encode_event(ev))
        assert type(back) is type(ev)
        assert back == ev


def test_mask_length_mismatch_is_rejected_with_the_fix() -> None:
    with pytest.raises(ValidationError, match="one 0/1 flag per token"):
        source(1).model_validate(source(1).model_dump() | {"action_mask": [1]})


def test_opd_turn_requires_one_teacher_logprob_per_token() -> None:
    turn = dict(run_id="r", source_id="s", update=0, policy_version=0, group_id="g", traj_id="t")
    turn |= dict(turn=0, offset=0, token_ids=[1, 2], action_mask=[0, 1])
    with pytest.raises(ValidationError, match="teacher_logprobs"):
        OpdTurnReady(**turn)
    with pytest.raises(ValidationError, match="one per token"):
        OpdTurnReady(**turn, teacher_logprobs=[0.0])


def test_each_source_carries_exactly_its_fields() -> None:
    """A member of the union refuses another member's fields (no optional-by-kind payload)."""
    reward = GrpoRewardReady(
        run_id="r",
        source_id="t/reward",
        update=0,
        policy_version=0,
        group_id="g",
        traj_id="t",
        index=0,
        reward=1.0,
    )
    with pytest.raises(ValidationError, match="token_ids"):
        GrpoRewardReady.model_validate(reward.model_dump() | {"token_ids": [1]})
    with pytest.raises(ValidationError, match="reward"):
        decode_event(source(1).model_dump_json()[:-1] + ', "reward": 1.0}')
    with pytest.raises(ValidationError, match="prompt_ids"):
        GroupRegistered(run_id="r", update=0, group_id="g", size=4, prompt_ids=[])


def test_dedup_key_is_the_source_id_not_the_event_id() -> None:
    a, b = source(1, source_id="same"), source(2, source_id="same")
    assert a.event_id != b.event_id
    assert a.dedup_key() == b.dedup_key()


def test_barrier_events_share_the_learner_topic_so_they_cannot_overtake_sources() -> None:
    assert default_topic(source(0)) == Topic.LEARNER
    assert (
        default_topic(GroupClosed(run_id="r", update=0, group_id="g", sources=1)) == Topic.LEARNER
    )
    assert default_topic(BatchClosed(run_id="r", update=0, groups=1, sources=1)) == Topic.LEARNER
    assert default_topic(PolicyPublished(run_id="r", version=1)) == Topic.CONTROL
    assert default_topic(LearnerReady(run_id="r", rank=0, version=0)) == Topic.SPANS


def test_span_serialises_to_the_spans_jsonl_contract() -> None:
    s = Span(
        run_id="r",
        update=3,
        role=Role.LEARNER,
        kind="grpo",
        ids={"source": "s1"},
        start=1,
        end=2,
        ready=0.5,
    )
    rec = s.to_jsonl_record()
    assert rec == {
        "type": "span",
        "update": 3,
        "role": "learner",
        "kind": "grpo",
        "ids": {"source": "s1"},
        "start": 1.0,
        "end": 2.0,
        "ready": 0.5,
    }
