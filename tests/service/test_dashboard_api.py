"""The API the dashboard's views read (issue 36): the run-config schema, the recipe choices,
per-run summaries (reward, median step time, speedup over the sync run), the favicon, and a
recipe-not-found message that names what the service takes (no .yaml paths)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from fastapi.testclient import TestClient
from service_helpers import wait_for

from thundersync.config import RunConfig


def _finished_run(client: TestClient, auth: dict[str, str], **body: object) -> dict[str, object]:
    res = client.post("/api/v1/runs", json=body, headers=auth)
    assert res.status_code == 201, res.text
    run_id = res.json()["id"]
    return wait_for(  # type: ignore[no-any-return]
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=auth).json(),
        lambda r: r["status"] == "succeeded",
    )


def test_config_schema_is_the_run_configs(client: TestClient, admin: dict[str, str]) -> None:
    res = client.get("/api/v1/config/schema", headers=admin)
    assert res.status_code == 200
    assert res.json() == RunConfig.model_json_schema()
    assert client.get("/api/v1/config/schema").status_code == 401


def test_recipe_choices_list_built_in_then_uploaded(
    client: TestClient, new_token: Callable[[str], dict[str, str]]
) -> None:
    user = new_token("alice")
    res = client.post(
        "/api/v1/recipes",
        json={"name": "mine", "yaml": "schedule: sync\nupdates: 3\n", "description": "short"},
        headers=user,
    )
    assert res.status_code == 201, res.text
    data = client.get("/api/v1/config/recipes", headers=user).json()["data"]
    by_name = {r["name"]: r for r in data}
    assert by_name["grpo-toy"]["origin"] == "built-in"
    assert by_name["mine"] == {
        "name": "mine",
        "origin": "uploaded",
        "objective": None,
        "schedule": "sync",
        "updates": 3,
        "description": "short",
    }
    assert data[-1]["name"] == "mine"
    # another token does not see it
    other = client.get("/api/v1/config/recipes", headers=new_token("bob")).json()["data"]
    assert "mine" not in {r["name"] for r in other}


def test_unknown_recipe_names_what_the_service_takes(
    client: TestClient, admin: dict[str, str]
) -> None:
    res = client.post("/api/v1/runs", json={"recipe": "nope"}, headers=admin)
    assert res.status_code == 422
    [err] = res.json()["detail"]
    assert err["loc"] == ["body", "recipe"]
    assert "grpo-toy" in err["msg"] and "uploaded" in err["msg"]
    assert ".yaml" not in err["msg"]


def test_run_summaries_give_reward_median_step_and_speedup(
    client: TestClient, admin: dict[str, str]
) -> None:
    base = _finished_run(
        client, admin, recipe="grpo-toy", name="base", overrides={"updates": 3, "schedule": "sync"}
    )
    stream = _finished_run(client, admin, recipe="grpo-toy", name="s", overrides={"updates": 4})
    res = client.get(
        "/api/v1/run-summaries",
        params={"ids": [stream["id"], base["id"]]},
        headers=admin,
    )
    assert res.status_code == 200, res.text
    mine, sync = res.json()["data"]
    assert mine["run_id"] == stream["id"] and sync["run_id"] == base["id"]
    updates = client.get(f"/api/v1/runs/{stream['id']}/updates", headers=admin).json()["data"]
    steps = [u["step_s"] for u in updates]
    assert mine["updates"] == 4
    assert mine["metric"] == "reward_mean" and mine["value"] == updates[-1]["reward_mean"]
    assert mine["reward"] == updates[-1]["reward_mean"]
    assert mine["step_s_median"] == statistics.median(steps)
    speedup = client.get(f"/api/v1/runs/{stream['id']}/speedup", headers=admin).json()
    assert mine["baseline_id"] == base["id"]
    assert mine["speedup"] == speedup["speedup"] is not None
    assert sync["baseline_id"] is None and sync["speedup"] is None  # a sync run has none


def test_run_summaries_leave_out_other_tokens_runs(
    client: TestClient, admin: dict[str, str], new_token: Callable[[str], dict[str, str]]
) -> None:
    run = _finished_run(client, admin, recipe="grpo-toy", overrides={"updates": 1})
    res = client.get("/api/v1/run-summaries", params={"ids": [run["id"]]}, headers=new_token("x"))
    assert res.status_code == 200 and res.json()["data"] == []
    assert client.get("/api/v1/run-summaries", headers=admin).status_code == 422  # ids required


def test_favicon_is_served(client: TestClient) -> None:
    res = client.get("/favicon.ico")
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("image/svg+xml")
    assert b"<svg" in res.content
    assert 'rel="icon"' in client.get("/").text
