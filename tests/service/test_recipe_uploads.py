"""Uploaded recipes on a real database: a token uploads run-config YAML, runs from it by name,
and neither a bad file nor another token's recipe gets past the API."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient
from service_helpers import wait_final

Headers = Callable[[str], dict[str, str]]

RECIPE = """\
# a smaller grpo-toy
objective: grpo
updates: 2
rollout:
  group_size: 4
  groups_per_update: 2
optim:
  lr: 0.02
"""


def test_uploaded_recipe_is_run_by_name_with_overrides_on_top(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    up = client.post("/api/v1/recipes", json={"name": "my-grpo", "yaml": RECIPE}, headers=h)
    assert up.status_code == 201, up.text
    assert up.json()["yaml"] == RECIPE
    res = client.post(
        "/api/v1/runs",
        json={"recipe": "my-grpo", "overrides": {"updates": 3}, "config": {"optim.beta1": 0.8}},
        headers=h,
    )
    assert res.status_code == 201, res.text
    run = res.json()
    assert run["recipe"] == "my-grpo"
    cfg = run["config"]
    assert cfg["updates"] == 3 and cfg["rollout"]["group_size"] == 4
    assert cfg["optim"]["lr"] == 0.02 and cfg["optim"]["beta1"] == 0.8
    assert wait_final(client, run["id"], h)["status"] == "succeeded"
    listed = client.get("/api/v1/recipes", headers=h).json()
    assert [r["name"] for r in listed["data"]] == ["my-grpo"] and listed["count"] == 1
    rid = up.json()["id"]
    assert client.delete(f"/api/v1/recipes/{rid}", headers=h).status_code == 200
    gone = client.post("/api/v1/runs", json={"recipe": "my-grpo"}, headers=h)
    assert gone.status_code == 422 and "my-grpo" in gone.text  # back to shipped names only


def test_bad_recipe_uploads_are_422s_naming_the_line_or_field(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    post = lambda name, text: client.post(  # noqa: E731
        "/api/v1/recipes", json={"name": name, "yaml": text}, headers=h
    )
    bad_yaml = post("broken", "objective: grpo\nrollout: [1, 2\n")
    assert bad_yaml.status_code == 422, bad_yaml.text
    assert (
        "invalid YAML at line 3" in bad_yaml.text and "yaml" in bad_yaml.json()["detail"][0]["loc"]
    )
    unknown = post("typo", "objective: grpo\noptim:\n  lrr: 0.1\n")
    assert unknown.status_code == 422 and "optim.lrr" in unknown.text, unknown.text
    not_finite = post("inf", "optim:\n  lr: .inf\n")
    assert not_finite.status_code == 422 and "optim.lr" in not_finite.text, not_finite.text
    listy = post("listy", "- 1\n- 2\n")
    assert listy.status_code == 422 and "mapping" in listy.text
    path_name = post("../etc", "objective: grpo\n")
    assert path_name.status_code == 422 and "name" in path_name.text
    shipped = post("grpo-toy", "objective: grpo\n")
    assert shipped.status_code == 409 and "shipped" in shipped.text
    assert post("ok", "objective: grpo\n").status_code == 201
    again = post("ok", "objective: opd\n")
    assert again.status_code == 409 and "exists" in again.text
    assert client.get("/api/v1/recipes", headers=h).json()["count"] == 1


def test_another_tokens_recipe_cannot_be_seen_or_used(
    client: TestClient, new_token: Headers
) -> None:
    alice, bob = new_token("alice"), new_token("bob")
    up = client.post("/api/v1/recipes", json={"name": "private", "yaml": RECIPE}, headers=alice)
    assert up.status_code == 201
    rid = up.json()["id"]
    assert client.get(f"/api/v1/recipes/{rid}", headers=bob).status_code == 404
    assert client.delete(f"/api/v1/recipes/{rid}", headers=bob).status_code == 404
    assert client.get("/api/v1/recipes", headers=bob).json()["count"] == 0
    used = client.post("/api/v1/runs", json={"recipe": "private"}, headers=bob)
    assert used.status_code == 422 and "not found" in used.text, used.text
    # the same name is free for bob, and each token runs its own
    mine = "objective: grpo\nupdates: 1\n"
    assert (
        client.post("/api/v1/recipes", json={"name": "private", "yaml": mine}, headers=bob)
    ).status_code == 201
    run = client.post("/api/v1/runs", json={"recipe": "private"}, headers=bob).json()
    assert run["config"]["updates"] == 1
