"""Live run pages: the SSE stream sends the run's state, updates, spans and log text as they
arrive and ends once the run is finished; cursors resume a stream without repeats."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi.testclient import TestClient
from service_helpers import wait_final

Headers = Callable[[str], dict[str, str]]


def read_events(client: TestClient, url: str, h: dict[str, str]) -> list[tuple[str, object]]:
    events = []
    with client.stream("GET", url, headers=h) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in res.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
    return events


def test_events_follow_a_run_to_the_end(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    run = client.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"updates": 4}}, headers=h
    ).json()
    events = read_events(client, f"/api/v1/runs/{run['id']}/events", h)
    kinds = [e for e, _ in events]
    assert kinds[0] == "run" and kinds[-1] == "end"
    statuses = [d["status"] for e, d in events if e == "run"]  # type: ignore[index]
    assert statuses[-1] == "succeeded"
    updates = [u["update"] for e, d in events if e == "updates" for u in d]  # type: ignore[union-attr]
    assert updates == [0, 1, 2, 3]
    spans = [s for e, d in events if e == "spans" for s in d["data"]]  # type: ignore[index]
    assert len(spans) == 20 and len({s["id"] for s in spans}) == 20
    logs = "".join(d["text"] for e, d in events if e == "log")  # type: ignore[index]
    assert "update 3 done" in logs


def test_events_resume_from_cursors(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    run = client.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"updates": 3}}, headers=h
    ).json()
    wait_final(client, run["id"], h)
    spans = client.get(f"/api/v1/runs/{run['id']}/spans", headers=h).json()["data"]
    url = f"/api/v1/runs/{run['id']}/events?after_update=1&after_span={spans[9]['id']}"
    events = read_events(client, url, h)
    updates = [u["update"] for e, d in events if e == "updates" for u in d]  # type: ignore[union-attr]
    got = [s["id"] for e, d in events if e == "spans" for s in d["data"]]  # type: ignore[index]
    assert updates == [2] and got == [s["id"] for s in spans[10:]]
