"""Kill the vLLM teacher server mid-update: it is restarted and the update still equals sync."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from thundersync.config import load_run_config
from thundersync.driver.faults import FaultPlan
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import RunDriver


def test_killed_teacher_server_is_restarted_and_the_update_still_equals_sync(
    tmp_path: Path,
) -> None:
    cfg = load_run_config(
        "opd-toy",
        {
            "updates": 2,
            "rollout.groups_per_update": 1,
            "rollout.group_size": 3,
            "teacher.backend": "vllm",
            "teacher.timeout_s": 120,
            "learner.accum_dtype": "float64",
        },
    )
    assert (
        RunDriver(cfg, tmp_path, log_batches=True, faults=FaultPlan(kill_teacher_after=2)).run()
        == 0
    )
    assert "teacher server killed" in (tmp_path / "log.txt").read_text()
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [0, 1]
    # the restarted teacher scores like the frozen teacher: compare with an HF forward
    from thundersync.hf_models import load_model

    teacher = load_model(tmp_path / "teacher")
    lines = (tmp_path / "batches" / "u00001-r0.jsonl").read_text().splitlines()
    turns = sorted((json.loads(x) for x in lines), key=lambda e: (e["traj_id"], e["turn"]))
    context: dict[str, list[int]] = {}  # each trajectory rebuilt from its turns' segments
    worst = 0.0
    for ev in turns:
        ctx = context.setdefault(ev["traj_id"], [])
        assert ev["offset"] == len(ctx)  # a turn carries only what follows the previous one
        ctx += ev["token_ids"]
        ids = torch.tensor([ctx])
        with torch.no_grad():
            lp = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1].float(), -1)
        ref = lp.gather(-1, ids[0, 1:].view(-1, 1))[:, 0]
        for t, (m, got) in enumerate(zip(ev["action_mask"], ev["teacher_logprobs"], strict=True)):
            pos = ev["offset"] + t
            if m and pos >= 1:
                worst = max(worst, abs(got - float(ref[pos - 1])))
    assert worst <= 5e-3
    gaps = replay_gap(tmp_path, cfg, tmp_path / "model")
    assert max(gaps) <= 1e-6
