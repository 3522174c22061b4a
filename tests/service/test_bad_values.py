"""Hand-written bad values are 422 naming the field, on SQLite and PostgreSQL, never 500: NaN and
Infinity literals (Python's JSON parser accepts them; JSON columns and responses do not), integers
beyond 64 bits, names over their column's length, deep nesting, and a recipe with bad YAML.

Bodies are sent as raw text so that the literals are exactly what a hand-written request holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

Headers = Callable[[str], dict[str, str]]

RUNS, TASK_SETS = "/api/v1/runs", "/api/v1/task-sets"
TASK_SET = '"name": "ts", "kind": "seta", "source": "s"'
RECIPES = "/api/v1/recipes"
LONG = "x" * 201  # runs.name, task_sets.name: String(200)


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


# (method, path, raw JSON body, expected status, field the error must name)
CASES = [
    ("POST", RUNS, '{"recipe": "grpo-toy", "overrides": {"optim.lr": NaN}}', 422, "optim.lr"),
    (
        "POST",
        RUNS,
        '{"recipe": "grpo-toy", "config": {"rollout": {"temperature": Infinity}}}',
        422,
        "rollout.temperature",
    ),
    ("POST", RUNS, '{"config": {"mfu_peak_flops": -Infinity}}', 422, "mfu_peak_flops"),
    ("POST", RUNS, '{"recipe": "grpo-toy", "overrides": {"optim.eps": 1e400}}', 422, "optim.eps"),
    ("POST", RUNS, '{"recipe": "grpo-toy", "overrides": {"tiny": NaN}}', 422, "overrides.tiny"),
    ("POST", RUNS, json.dumps({"recipe": "grpo-toy", "overrides": {"seed": 2**70}}), 422, "seed"),
    (
        "POST",
        RUNS,
        json.dumps({"recipe": "grpo-toy", "config": {"updates": 2**63}}),
        422,
        "updates",
    ),
    (
        "POST",
        RUNS,
        json.dumps({"recipe": "grpo-toy", "overrides": {"model.tiny_seed": -(2**63) - 1}}),
        422,
        "model.tiny_seed",
    ),
    ("POST", RUNS, json.dumps({"recipe": "grpo-toy", "config": {"name": LONG}}), 422, "name"),
    ("POST", RUNS, json.dumps({"recipe": "grpo-toy", "overrides": {"name": LONG}}), 422, "name"),
    ("POST", RUNS, json.dumps({"recipe": "grpo-toy", "name": LONG}), 422, "name"),
    ("POST", RUNS, json.dumps({"recipe": "r" * 201}), 422, "recipe"),
    ("POST", RUNS, json.dumps({"recipe": "../recipes/grpo-toy"}), 422, "recipe"),
    ("POST", TASK_SETS, "{" + TASK_SET + ', "meta": {"a": NaN}}', 422, "meta.a"),
    ("POST", TASK_SETS, "{" + TASK_SET + ', "meta": {"a": [1, {"b": -Infinity}]}}', 422, "b"),
    ("POST", TASK_SETS, "{" + TASK_SET + ', "meta": ' + _nested(900) + "}", 422, "meta.a"),
    ("POST", TASK_SETS, json.dumps({"name": LONG, "kind": "seta", "source": "s"}), 422, "name"),
    ("PATCH", TASK_SETS + "/{task_set}", '{"meta": {"x": Infinity}}', 422, "meta.x"),
    ("POST", "/api/v1/tokens", json.dumps({"name": "n" * 101}), 422, "name"),
    # a NUL that only YAML decoding makes (the JSON body holds a backslash and a zero)
    ("POST", RECIPES, json.dumps({"name": "nul", "yaml": 'name: "a\\0b"\n'}), 422, "name"),
    (
        "POST",
        RUNS,
        json.dumps({"recipe": "grpo-toy", "overrides": {"env.sandbox": "none"}}),
        422,
        "env.sandbox",
    ),
    (
        "POST",
        RUNS,
        json.dumps({"recipe": "opd-toy", "overrides": {"teacher.backend": "x"}}),
        422,
        "teacher.backend",
    ),
    (
        "POST",
        RUNS,
        json.dumps({"recipe": "grpo-toy", "overrides": {"rollout.vllm.dtype": "x"}}),
        422,
        "rollout.vllm.dtype",
    ),
]


def _named(detail: object, field: str) -> bool:
    """The field is in an error's message or its location (body.a.b)."""
    if not isinstance(detail, list):
        return field in str(detail)
    for err in detail:
        loc = ".".join(str(p) for p in err.get("loc", []))
        if field in err.get("msg", "") or field in loc:
            return True
    return False


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    CASES,
    ids=[f"{i:02d}-{c[1].split('/')[3]}-{c[4]}" for i, c in enumerate(CASES)],
)
def test_bad_values_are_422_naming_the_field(
    client: TestClient,
    admin: dict[str, str],
    method: str,
    path: str,
    body: str,
    status: int,
    field: str,
) -> None:
    headers = {**admin, "Content-Type": "application/json"}
    if "{task_set}" in path:
        made = client.post(
            TASK_SETS, json={"name": "t", "kind": "seta", "source": "s"}, headers=admin
        )
        path = path.format(task_set=made.json()["id"])
    res = client.request(method, path, content=body, headers=headers)
    assert res.status_code == status, res.text
    assert _named(res.json()["detail"], field), res.text
    # nothing was stored, and every list still serialises
    for listing in (RUNS, TASK_SETS):
        got = client.get(listing, headers=admin)
        assert got.status_code == 200, got.text
    assert client.get(RUNS, headers=admin).json()["count"] == 0


def test_normal_values_next_to_the_bad_ones_are_accepted(
    client: TestClient, admin: dict[str, str]
) -> None:
    body = {
        "recipe": "grpo-toy",
        "name": "n" * 200,
        "overrides": {"seed": 2**63 - 1, "optim.lr": 1e-300, "optim.beta2": 0.5, "updates": 1},
    }
    res = client.post(RUNS, json=body, headers=admin)
    assert res.status_code == 201, res.text
    meta = {"big": 2**70, "huge": 1e308, "tiny": -1e-308, "deep": json.loads(_nested(30))}
    made = client.post(
        TASK_SETS,
        json={"name": "t" * 200, "kind": "seta", "source": "s", "meta": meta},
        headers=admin,
    )
    assert made.status_code == 201, made.text
    assert made.json()["meta"] == meta


def test_recipe_with_bad_yaml_is_422_naming_file_and_line(
    client: TestClient,
    admin: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "unclosed.yaml").write_text("name: ok\nupdates: 2\nrollout: {group_size: 4\n")
    (recipes / "tab.yaml").write_text("name: ok\n\tupdates: 2\n")
    (recipes / "colon.yaml").write_text("name: ok\nupdates: 2: 3\n")
    monkeypatch.setattr("thundersync.config.RECIPES_DIR", recipes)
    for recipe, line in (("unclosed", "line 4"), ("tab", "line 2"), ("colon", "line 2")):
        res = client.post(RUNS, json={"recipe": recipe}, headers=admin)
        assert res.status_code == 422, res.text
        err = res.json()["detail"][0]
        assert err["loc"] == ["body", "recipe"], err
        assert f"recipes/{recipe}.yaml" in err["msg"] and line in err["msg"], err["msg"]
    assert client.get(RUNS, headers=admin).json()["count"] == 0
