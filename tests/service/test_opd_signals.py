"""OPD's own signals (issue 36): a real opd-toy run (2 updates, launched by the service's
launcher with the real `tsrl train`) reports kl_mean, distill_loss and scored_tokens per update in
metrics.jsonl; update 0's values equal an independent computation in plain torch (a full-sequence
forward of theta_0 over the logged turns, against the logged teacher log-probs); the updates
endpoint returns them, and time-to-target runs on KL (reached at kl_mean <= target)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, wait_final

from thundersync.bus.events import OpdTurnReady, decode_event
from thundersync.hf_models import load_model
from thundersync.rundir import RunFiles
from thundersync.service.main import create_app
from thundersync.service.settings import default_driver_command


def _independent(run_dir: Path, update: int) -> tuple[float, float, int]:
    """(mean KL, mean surrogate loss, scored tokens) of `update` from its batch log: each
    trajectory's turns joined into one sequence, log pi_theta_k by one plain forward."""
    files = RunFiles(run_dir)
    assert update == 0, "theta_0 is the run's model/; later versions need their weights"
    model = load_model(files.model, dtype=torch.float64)
    turns: dict[str, list[OpdTurnReady]] = {}
    for path in files.batch_logs()[update]:
        for line in path.read_text().splitlines():
            ev = decode_event(line)
            if isinstance(ev, OpdTurnReady):
                turns.setdefault(ev.traj_id, []).append(ev)
    kl = loss = 0.0
    n = 0
    for evs in turns.values():
        evs.sort(key=lambda e: e.turn)
        ids = [t for e in evs for t in e.token_ids]
        mask = [m for e in evs for m in e.action_mask]
        teacher = [lp for e in evs for lp in e.teacher_logprobs]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for i in range(1, len(ids)):
            if mask[i]:  # token i, predicted at position i - 1
                student = float(logp[i - 1, ids[i]])
                adv = teacher[i] - student
                kl += -adv
                loss += -adv * student
                n += 1
    return kl / n, loss / n, n


def test_opd_run_reports_kl_per_update_and_the_api_returns_it(tmp_path: Path) -> None:
    settings = make_settings(
        f"sqlite:///{tmp_path / 'test.db'}",
        tmp_path / "data",
        driver_command=default_driver_command(),
    )
    auth = bearer(ADMIN_TOKEN)
    overrides = {
        "updates": 2,
        "rollout.groups_per_update": 2,
        "rollout.group_size": 4,
        "record_batches": True,
    }
    with TestClient(create_app(settings)) as client:
        res = client.post(
            "/api/v1/runs", json={"recipe": "opd-toy", "overrides": overrides}, headers=auth
        )
        assert res.status_code == 201, res.text
        run_id = res.json()["id"]
        run = wait_final(client, run_id, auth)
        assert run["status"] == "succeeded", run
        updates = client.get(f"/api/v1/runs/{run_id}/updates", headers=auth).json()["data"]
        ttt = client.get(f"/api/v1/runs/{run_id}/time-to-target?target=1e9", headers=auth).json()
    run_dir = settings.runs_dir / run_id
    lines = RunFiles(run_dir).read_metrics()
    assert [m["update"] for m in lines] == [0, 1]
    for m in lines:
        assert math.isfinite(m["kl_mean"]) and math.isfinite(m["distill_loss"])
        assert m["scored_tokens"] > 0
    # the API carries the same numbers, typed, beside the raw extra fields
    assert [(u["kl_mean"], u["distill_loss"], u["scored_tokens"]) for u in updates] == [
        (m["kl_mean"], m["distill_loss"], m["scored_tokens"]) for m in lines
    ]
    assert updates[0]["extra"]["kl_mean"] == lines[0]["kl_mean"]
    # an independent computation of update 0 (float64, full sequences, no K/V reuse)
    kl, loss, n = _independent(run_dir, 0)
    m0 = lines[0]
    assert m0["scored_tokens"] == n
    assert math.isclose(m0["kl_mean"], kl, rel_tol=1e-5, abs_tol=1e-6), (m0["kl_mean"], kl)
    assert math.isclose(m0["distill_loss"], loss, rel_tol=1e-5, abs_tol=1e-6)
    # time to target on KL: every update is at or below a huge target, the first one reaches it
    assert ttt["metric"] == "kl_mean" and ttt["lower_is_better"] is True
    assert [p["value"] for p in ttt["curve"]] == [m["kl_mean"] for m in lines]
    assert ttt["time_to_target_s"] == ttt["curve"][0]["t"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["objective"] == "opd"


def test_two_learner_ranks_report_the_whole_updates_kl(tmp_path: Path) -> None:
    """Each rank applies only its own trajectories; the reported KL, loss and N_k are summed over
    both ranks (every rank's batch log), not rank 0's share."""
    from thundersync.config import load_run_config
    from thundersync.driver.run import RunDriver

    over = {"updates": 1, "rollout.groups_per_update": 4, "rollout.group_size": 4}
    cfg = load_run_config("opd-toy", over | {"learner.ranks": 2})
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0
    logs = RunFiles(tmp_path).batch_logs()[0]
    assert len(logs) == 2 and all(p.read_text().strip() for p in logs)  # both ranks had work
    (m0,) = RunFiles(tmp_path).read_metrics()
    kl, loss, n = _independent(tmp_path, 0)
    assert m0["scored_tokens"] == n
    assert math.isclose(m0["kl_mean"], kl, rel_tol=1e-5, abs_tol=1e-6), (m0["kl_mean"], kl)
    assert math.isclose(m0["distill_loss"], loss, rel_tol=1e-5, abs_tol=1e-6)
