"""Readable run logs (issue 36): the per-update log is the default, the driver's output is rendered
as a terminal shows it (tqdm bars in their last state, none run together), and a run that is
still setting up shows its stage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, wait_final, wait_for
from tqdm import tqdm

from thundersync.rundir import RunFiles
from thundersync.service.logs import read_log_chunk
from thundersync.service.main import create_app
from thundersync.service.tables import Run

H = bearer(ADMIN_TOKEN)


def write_tqdm_stream(path: Path) -> None:
    """What a driver's libraries print: two finished bars, coloured text, a bar still moving."""
    with path.open("w") as f:
        f.write("fake driver: setting up\n")
        for name, n in (("Loading weights", 21), ("Converting tensors", 40)):
            for _ in tqdm(range(n), desc=name, file=f, mininterval=0, ascii=True):
                pass
        f.write("\x1b[32mINFO\x1b[0m engine ready\n")
        bar = tqdm(total=20, desc="Processed prompts", file=f, mininterval=0, ascii=True)
        bar.update(7)  # not closed: no newline yet
        f.flush()


def test_tqdm_bars_render_as_their_last_state(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    write_tqdm_stream(path)
    raw = path.read_bytes()
    assert raw.count(b"\r") > 40 and b"\x1b[" in raw  # the noise a raw view shows
    chunk = read_log_chunk(path, 0, 1 << 20, terminal=True)
    lines = chunk.text.splitlines()
    assert lines[0] == "fake driver: setting up"
    assert lines[1].startswith("Loading weights: 100%") and "21/21" in lines[1]
    assert lines[2].startswith("Converting tensors: 100%") and "40/40" in lines[2]
    assert lines[3] == "INFO engine ready"
    assert len(lines) == 4
    assert all(x.count("%|") <= 1 for x in lines)  # no bars run together
    assert "\r" not in chunk.text and "\x1b" not in chunk.text
    # the moving bar: its current state apart, re-read from its start until it ends
    assert chunk.partial.startswith("Processed prompts:  35%") and "7/20" in chunk.partial
    assert chunk.next_offset == raw.rfind(b"\n") + 1 and chunk.size == len(raw)


@pytest.mark.parametrize("limit", [100, 200, 4096])
def test_chunked_reading_renders_the_same_lines(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "output.log"
    write_tqdm_stream(path)
    whole = read_log_chunk(path, 0, 1 << 20, terminal=True)
    text, offset, partial = "", 0, ""
    for _ in range(10_000):
        chunk = read_log_chunk(path, offset, limit, terminal=True)
        text, partial = text + chunk.text, chunk.partial
        if chunk.next_offset == chunk.size or chunk.next_offset == offset == chunk.offset:
            break
        offset = chunk.next_offset
    assert text == whole.text
    assert "7/20" in partial


def test_tiny_chunks_still_make_progress(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    write_tqdm_stream(path)
    offset, reads = 0, 0
    while True:
        chunk = read_log_chunk(path, offset, 1, terminal=True)
        assert "\r" not in chunk.text
        if chunk.next_offset == offset:  # only at the last, unterminated line's last byte
            assert offset == chunk.size - 1 and chunk.partial
            break
        offset, reads = chunk.next_offset, reads + 1
    assert reads > 100


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app with its launcher on SQLite, the stand-in driver (tests/service/fake_driver.py)."""
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    with TestClient(create_app(settings)) as c:
        yield c


def run_files(client: TestClient, run_id: str) -> RunFiles:
    with client.app.state.session_factory() as session:  # type: ignore[attr-defined]
        run = session.get(Run, uuid.UUID(run_id))
        assert run is not None
        return RunFiles(run.run_dir)


def submit(client: TestClient, name: str, **overrides: object) -> str:
    body = {"recipe": "grpo-toy", "name": name, "overrides": overrides}
    res = client.post("/api/v1/runs", json=body, headers=H)
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


def test_logs_default_to_the_per_update_log_and_render_the_output(client: TestClient) -> None:
    run_id = submit(client, "two-updates", updates=2)
    assert wait_final(client, run_id, H)["status"] == "succeeded"
    default = client.get(f"/api/v1/runs/{run_id}/logs", headers=H).json()
    assert "update 1 done" in default["text"] and "fake driver:" not in default["text"]
    assert default["text"] == run_files(client, run_id).log.read_text()

    files = run_files(client, run_id)
    write_tqdm_stream(files.output_log)
    out = client.get(f"/api/v1/runs/{run_id}/logs", params={"source": "output"}, headers=H)
    lines = out.json()["text"].splitlines()
    assert len(lines) == 4 and "40/40" in lines[2] and "\r" not in out.json()["text"]
    assert "7/20" in out.json()["partial"]
    # the live page's stream serves the same choice: the per-update log unless asked otherwise
    with client.stream("GET", f"/api/v1/runs/{run_id}/events", headers=H) as res:
        body = "".join(res.iter_text())
    assert "update 1 done" in body and "Converting tensors" not in body


def test_a_starting_run_shows_its_stage(client: TestClient) -> None:
    run_id = submit(client, "staged-convert")
    run = wait_for(
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=H).json(),
        lambda r: r["reason"] == "converting SmolLM2-135M (GGUF to float32) (3/4)",
    )
    assert run["status"] in ("starting", "running") and run["updates_done"] == 0
    log = client.get(f"/api/v1/runs/{run_id}/logs", headers=H).json()["text"]
    assert "stage: model: converting SmolLM2-135M" in log
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=H).status_code == 200
    final = wait_final(client, run_id, H)
    assert final["status"] == "cancelled"
    assert final["reason"] == "cancelled while converting the model"  # the stage is not kept
