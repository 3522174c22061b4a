"""A run whose trajectories would outgrow its engines' context is refused at submission (422 naming
the fields and the fix), through the same loader as `tsrl train`; nothing is queued."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

Headers = Callable[[str], dict[str, str]]
LONG = {"rollout.engine": "vllm", "rollout.max_total_tokens": 131072}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({**LONG, "rollout.vllm.max_model_len": 8192}, "rollout.vllm.max_model_len=8192"),
        (
            {
                **LONG,
                "objective": "opd",
                "teacher.model": "smollm2",
                "teacher.backend": "vllm",
                "teacher.vllm.max_model_len": 8192,
            },
            "teacher.vllm.max_model_len=8192",
        ),
    ],
)
def test_a_context_longer_than_the_engine_is_422(
    client: TestClient, new_token: Headers, overrides: dict, field: str
) -> None:
    body = {"recipe": "grpo-toy", "overrides": overrides}
    res = client.post("/api/v1/runs", json=body, headers=new_token("u"))
    assert res.status_code == 422, res.text
    msg = res.json()["detail"][0]["msg"]
    assert field in msg and "rollout.max_total_tokens=131072" in msg, msg
    assert "or more" in msg, msg  # the fix
    assert client.get("/api/v1/runs", headers=new_token("v")).json()["count"] == 0
