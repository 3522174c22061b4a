"""Runs API on a real database: create from a recipe or a config, list with paging and filters,
get with the resolved config, cancel, delete; updates and spans as ingested from the driver."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from service_helpers import wait_final

Headers = Callable[[str], dict[str, str]]


def test_run_from_recipe_succeeds_with_updates_and_spans(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    res = client.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"updates": 3}}, headers=h
    )
    assert res.status_code == 201, res.text
    run = res.json()
    assert run["status"] == "queued" and run["recipe"] == "grpo-toy"
    assert run["config"]["updates"] == 3 and run["config"]["rollout"]["group_size"] == 8
    final = wait_final(client, run["id"], h)
    assert final["status"] == "succeeded", final
    assert final["reason"] == "3 updates" and final["updates_done"] == 3
    assert final["started_at"] and final["finished_at"]
    ups = client.get(f"/api/v1/runs/{run['id']}/updates", headers=h).json()
    assert [u["update"] for u in ups["data"]] == [0, 1, 2] and ups["count"] == 3
    assert ups["data"][2]["reward_mean"] == 0.2 and ups["data"][0]["tokens"] == 64
    assert client.get(f"/api/v1/runs/{run['id']}/updates?after=0", headers=h).json()["count"] == 2
    spans = client.get(f"/api/v1/runs/{run['id']}/spans", headers=h).json()
    assert spans["count"] == 15 and spans["t0"] == spans["data"][0]["start"]
    assert {s["role"] for s in spans["data"]} == {
        "rollout",
        "tool",
        "teacher",
        "learner",
        "barrier",
    }
    learner = client.get(f"/api/v1/runs/{run['id']}/spans?role=learner&update=1", headers=h).json()
    assert learner["count"] == 1 and learner["data"][0]["ready"] is not None
    t_mid = spans["data"][5]["start"]
    window = client.get(
        f"/api/v1/runs/{run['id']}/spans", params={"start": t_mid, "end": t_mid}, headers=h
    ).json()
    assert 1 <= window["count"] < 15
    logs = client.get(f"/api/v1/runs/{run['id']}/logs", headers=h).json()
    assert "update 2 done" in logs["text"] and logs["next_offset"] == logs["size"]
    driver_log = client.get(f"/api/v1/runs/{run['id']}/logs?source=log", headers=h).json()
    assert driver_log["text"].splitlines()[0].endswith(" update 0 done")  # "HH:MM:SS msg" lines


def test_run_from_full_config_stores_resolved_config(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    body = {"config": {"name": "mine", "updates": 1, "schedule": "sync", "optim": {"lr": 0.01}}}
    run = client.post("/api/v1/runs", json=body, headers=h).json()
    assert run["name"] == "mine" and run["recipe"] is None and run["schedule"] == "sync"
    got = client.get(f"/api/v1/runs/{run['id']}", headers=h).json()
    assert got["config"]["optim"]["lr"] == 0.01 and got["config"]["optim"]["beta1"] == 0.9
    assert got["config"]["output_dir"].endswith(f"{run['id']}/output")
    assert wait_final(client, run["id"], h)["status"] == "succeeded"


def test_list_pages_and_filters(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    ids = []
    for i in range(3):
        body = {"recipe": "grpo-toy", "name": f"r{i}", "overrides": {"updates": 1}}
        if i == 2:
            body["overrides"]["schedule"] = "sync"
        ids.append(client.post("/api/v1/runs", json=body, headers=h).json()["id"])
    for rid in ids:
        wait_final(client, rid, h)
    page = client.get("/api/v1/runs?limit=2", headers=h).json()
    assert page["count"] == 3 and len(page["data"]) == 2
    rest = client.get("/api/v1/runs?limit=2&skip=2", headers=h).json()
    assert len(rest["data"]) == 1
    seen = {r["id"] for r in page["data"]} | {r["id"] for r in rest["data"]}
    assert seen == set(ids)
    sync = client.get("/api/v1/runs?schedule=sync", headers=h).json()
    assert [r["name"] for r in sync["data"]] == ["r2"]
    assert client.get("/api/v1/runs?name=r1", headers=h).json()["count"] == 1
    assert client.get("/api/v1/runs?status=succeeded", headers=h).json()["count"] == 3
    assert client.get("/api/v1/runs?recipe=other", headers=h).json()["count"] == 0


def finished_run(client: TestClient, h: dict[str, str], overrides: dict[str, object]) -> str:
    """A grpo-toy run with `overrides`, waited for until final; its id."""
    run_id = str(
        client.post(
            "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": overrides}, headers=h
        ).json()["id"]
    )
    wait_final(client, run_id, h)
    return run_id


def test_speedup_against_a_sync_run_of_the_same_recipe(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    stream_id = finished_run(client, h, {"updates": 2})
    none = client.get(f"/api/v1/runs/{stream_id}/speedup", headers=h).json()
    assert none["baseline_id"] is None and none["speedup"] is None
    sync_id = finished_run(client, h, {"updates": 4, "schedule": "sync"})
    s = client.get(f"/api/v1/runs/{stream_id}/speedup", headers=h).json()
    # fake driver step_s = 0.05 + 0.01 k: sync mean 0.065, stream mean 0.055
    assert s["baseline_id"] == sync_id
    assert abs(s["speedup"] - 0.065 / 0.055) < 1e-9


def test_time_to_target_against_a_sync_run_of_the_same_recipe(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    stream_id = finished_run(client, h, {"updates": 2})
    alone = client.get(f"/api/v1/runs/{stream_id}/time-to-target?target=0.1", headers=h).json()
    assert alone["baseline_id"] is None and alone["baseline_curve"] == [] and alone["ratio"] is None
    sync_id = finished_run(client, h, {"updates": 4, "schedule": "sync"})
    got = client.get(f"/api/v1/runs/{stream_id}/time-to-target?target=0.1", headers=h).json()
    # fake driver: reward_mean 0.1 k; wall time from the start of update 0 (its step_s is 0.05)
    assert got["baseline_id"] == sync_id and got["target"] == 0.1
    assert [p["update"] for p in got["curve"]] == [0, 1]
    assert [p["update"] for p in got["baseline_curve"]] == [0, 1, 2, 3]
    # (wall clock seconds since the epoch in a float column: ~1e-7 s resolution)
    assert got["curve"][0]["t"] == pytest.approx(0.05, abs=1e-6)
    assert got["baseline_curve"][3]["reward"] == pytest.approx(0.3)
    t, tb = got["time_to_target_s"], got["baseline_time_to_target_s"]
    assert t == got["curve"][1]["t"] and tb == got["baseline_curve"][1]["t"]
    assert got["ratio"] == tb / t
    # a target only the sync run reached: this run has no time, so no ratio
    late = client.get(f"/api/v1/runs/{stream_id}/time-to-target?target=0.25", headers=h).json()
    assert late["time_to_target_s"] is None and late["ratio"] is None
    assert late["baseline_time_to_target_s"] == late["baseline_curve"][3]["t"]
    bad = client.get(f"/api/v1/runs/{stream_id}/time-to-target?target=nan", headers=h)
    assert bad.status_code == 422 and "target" in bad.text


def test_delete_finished_run_and_refuse_active(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    slow = client.post(
        "/api/v1/runs",
        json={"recipe": "grpo-toy", "name": "slow", "overrides": {"updates": 500}},
        headers=h,
    ).json()
    res = client.delete(f"/api/v1/runs/{slow['id']}", headers=h)
    assert res.status_code == 409 and "cancel it first" in res.json()["detail"]
    client.post(f"/api/v1/runs/{slow['id']}/cancel", headers=h)
    assert wait_final(client, slow["id"], h)["status"] == "cancelled"
    assert client.delete(f"/api/v1/runs/{slow['id']}", headers=h).status_code == 200
    assert client.get(f"/api/v1/runs/{slow['id']}", headers=h).status_code == 404
    assert client.get(f"/api/v1/runs/{slow['id']}/updates", headers=h).status_code == 404
