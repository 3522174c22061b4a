"""SkyRL runs through the API: `{"skyrl": {<SkyRL overrides>}}` names a model artifact and a
skyrl-gym task set (a dataset file with its task folders); the service translates it like
`trainer.override_entrypoint=thundersync.skyrl.entrypoint`, keeps every row's task inside the
set's folder, and the run trains with the real driver and shows on the dashboard."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from service_helpers import wait_succeeded
from test_acceptance_flow import served  # noqa: F401  (the fixture: `tsrl serve` + real driver)

from thundersync.hf_models import build_tiny_model
from thundersync.sandbox.envs.fixtures import builtin_task_dir, terminal_tasks

Headers = Callable[[str], dict[str, str]]
RUNS, MODELS, SETS = "/api/v1/runs", "/api/v1/models", "/api/v1/task-sets"
TASKS = terminal_tasks(builtin_task_dir("terminal-easy"))[:2]


def _upload(api: Any, url: str, root: Path, prefix: str = "") -> None:
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        res = api.put(f"{url}/{prefix}{f.relative_to(root).as_posix()}", content=f.read_bytes())
        assert res.status_code == 200, res.text


def _artifacts(api: Any, tmp: Path, rows: list[dict[str, Any]]) -> None:
    """A model artifact 'tiny' and a skyrl-gym task set 'easy' (train.jsonl + tasks/<name>/)."""
    model = api.post(MODELS, json={"name": "tiny"}).json()
    _upload(api, f"{MODELS}/{model['id']}/files", build_tiny_model(tmp / "tiny", seed=0))
    ts = api.post(SETS, json={"name": "easy", "kind": "skyrl-gym"}).json()
    for d in TASKS:
        _upload(api, f"{SETS}/{ts['id']}/files", d, prefix=f"tasks/{d.name}/")
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    assert api.put(f"{SETS}/{ts['id']}/files/train.jsonl", content=body).status_code == 200


def _rows() -> list[dict[str, Any]]:
    return [{"env_class": "tsrl-terminal", "task": f"tasks/{d.name}"} for d in TASKS]


SKYRL = {
    "trainer.policy.model.path": "tiny",
    "data.train_data": ["easy"],
    "trainer.train_batch_size": 1,
    "trainer.policy_mini_batch_size": 1,
    "generator.n_samples_per_prompt": 2,
    "generator.sampling_params.max_generate_length": 12,
    "trainer.algorithm.use_kl_loss": False,
    "trainer.algorithm.loss_reduction": "sequence_mean",
    "trainer.run_name": "skyrl-api",
}


class _Api:
    """TestClient calls with one token's header (the same surface as httpx.Client)."""

    def __init__(self, client: TestClient, h: dict[str, str]) -> None:
        self.client, self.h = client, h

    def post(self, url: str, **kw: Any) -> Any:
        return self.client.post(url, headers=self.h, **kw)

    def put(self, url: str, **kw: Any) -> Any:
        return self.client.put(url, headers=self.h, **kw)


def _loc(res: Any) -> tuple[list[str], str]:
    assert res.status_code == 422, res.text
    err = res.json()["detail"][0]
    return err["loc"], err["msg"]


def test_a_skyrl_config_is_translated_and_its_rows_stay_in_the_task_set(
    client: TestClient, new_token: Headers, tmp_path: Path
) -> None:
    api = _Api(client, new_token("u"))
    _artifacts(api, tmp_path, [*_rows(), {"env_class": "tsrl-terminal", "task": "/etc"}])
    res = api.post(RUNS, json={"skyrl": SKYRL})
    loc, msg = _loc(res)  # the third row names a host path: refused, untouched
    assert loc[-2:] == ["env", "tasks"] and "row 2: task '/etc' leaves the task set" in msg
    # SkyRL's defaults that have no exact streaming form are named by their SkyRL field
    res = api.post(RUNS, json={"skyrl": {**SKYRL, "trainer.algorithm.use_kl_loss": True}})
    assert "trainer.algorithm.use_kl_loss=True" in _loc(res)[1]
    res = api.post(RUNS, json={"skyrl": {**SKYRL, "data.train_data": ["nope"]}})
    assert _loc(res)[0][-1] == "data.train_data"
    res = api.post(RUNS, json={"recipe": "grpo-toy", "skyrl": SKYRL})
    assert _loc(res)[0][-1] == "skyrl"


def test_a_skyrl_config_becomes_a_confined_streaming_run(
    client: TestClient, new_token: Headers, tmp_path: Path
) -> None:
    api = _Api(client, new_token("u"))
    _artifacts(api, tmp_path, _rows())
    res = api.post(RUNS, json={"skyrl": SKYRL, "overrides": {"rollout.concurrency": 2}})
    assert res.status_code == 201, res.text
    cfg = res.json()["config"]
    assert cfg["name"] == "skyrl-api" and cfg["updates"] == 2  # 2 rows, 1 prompt per step
    assert cfg["env"]["name"] == "skyrl-dataset" and cfg["env"]["dataset_confined"] is True
    assert cfg["env"]["tasks"].endswith("/train.jsonl")
    assert cfg["learner"]["estimator"] == "grpo_sample_std"
    assert cfg["rollout"]["group_size"] == 2 and cfg["rollout"]["concurrency"] == 2
    assert cfg["model"]["path"] != "tiny"  # resolved to the artifact's folder


@pytest.mark.slow
def test_a_skyrl_run_trains_through_the_service_and_shows_on_the_dashboard(
    served: tuple[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    base, token = served
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as api:
        _artifacts(api, tmp_path, _rows())
        res = api.post(RUNS, json={"skyrl": SKYRL})
        assert res.status_code == 201, res.text
        run_id = res.json()["id"]
        wait_succeeded(api, run_id)
        updates = api.get(f"{RUNS}/{run_id}/updates").json()["data"]
        assert [u["update"] for u in updates] == [0, 1]
        assert all(u["step_s"] > 0 and u["tokens"] > 0 for u in updates)
        assert all("score/reward" in u["extra"] for u in updates)  # the tasks' verifiers
        assert api.get(f"{RUNS}/{run_id}/spans").json()["count"] > 0
        # the runs list's row: its updates and reward curve, as for a native run
        (row,) = api.get("/api/v1/run-summaries", params={"ids": run_id}).json()["data"]
        assert row["run_id"] == run_id and row["updates"] == 2 and row["reward"] is not None
    page = httpx.get(base + "/")  # the dashboard (its run page is the route #/runs/ID)
    assert page.status_code == 200 and "ThunderSync" in page.text
