"""Weights through shared memory: exact bytes, HF engine loads, routing across replicas, pruning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from thundersync.config import load_run_config
from thundersync.hf_models import load_model
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.replicas import ReplicaLoadError, ReplicaSet
from thundersync.rollout.types import SamplingParams
from thundersync.rollout.weight_wire import (
    ShmWeights,
    WeightWireError,
    iter_shm,
    read_index,
    read_shm,
    sweep_orphans,
    write_shm,
)
from thundersync.rundir import RunFiles
from thundersync.worker.policy_writer import PolicyWriter

PROMPT = [1, 10, 11, 12, 13]


def _perturbed(model_dir: Path, scale: float = 0.05) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    sd = load_model(model_dir).state_dict()
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in sd.items()}


def test_segment_round_trips_every_dtype_bit_for_bit(tmp_path: Path) -> None:
    sd = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7).to(torch.bfloat16),  # bf16 stays bf16 on the wire
        "c": torch.randn(2, 2).double(),
        "empty": torch.empty(0, 4),
        "view": torch.randn(4, 6)[:, 1:3],  # non-contiguous input
    }
    w = write_shm(tmp_path / "seg.bin", sd, version=3)
    back = read_shm(w)
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(back[k], v), k
    assert (tmp_path / "seg.bin").stat().st_size == w.path.stat().st_size
    w.remove()
    with pytest.raises(WeightWireError, match="no index"):
        read_shm(w)


def test_a_meta_tensor_is_refused_by_name_before_the_slot_is_touched(tmp_path: Path) -> None:
    """Tensors off the CPU are copied device-to-host (tests/gpu: CUDA); a meta tensor has no
    bytes: refused by name, and the slot keeps its published version."""
    w = write_shm(tmp_path / "seg.bin", {"a": torch.randn(4)}, version=1)
    meta = {"a": torch.randn(4), "m": torch.empty(3, device="meta")}
    with pytest.raises(WeightWireError, match="'m' is on the meta device"):
        write_shm(tmp_path / "seg.bin", meta, version=2)
    assert read_index(w)["version"] == 1  # the published version is intact


def test_a_slot_rewritten_in_place_holds_the_new_version_exactly(tmp_path: Path) -> None:
    a = {"w": torch.randn(64, 8), "b": torch.randn(3).to(torch.bfloat16)}
    b = {k: v + 1 for k, v in a.items()}
    w1 = write_shm(tmp_path / "slot.bin", a, version=1)
    inode = w1.path.stat().st_ino
    w2 = write_shm(tmp_path / "slot.bin", b, version=2)
    assert w2.path.stat().st_ino == inode  # the same pages, overwritten
    back = dict(iter_shm(w2, version=2))
    assert all(torch.equal(back[k], b[k]) for k in b)
    with pytest.raises(WeightWireError, match="not 1"):
        dict(iter_shm(w1, version=1))


def test_hf_engine_serves_the_new_weights_from_shared_memory(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    eng = HFEngine(tiny_model_dir)
    new = _perturbed(tiny_model_dir)
    w = write_shm(tmp_path / "v1.bin", new, version=1)
    ack = eng.load_weights(1, w.uri)
    assert ack.version == 1 and eng.version == 1
    gen = eng.generate(PROMPT, SamplingParams(6, 1.0), seed=0, version=1)
    ref = load_model(tiny_model_dir)  # an independent forward of the new weights
    ref.load_state_dict(new)
    ids = torch.tensor([PROMPT + gen.token_ids])
    with torch.no_grad():
        lp = ref(ids).logits.float().log_softmax(-1)[0, len(PROMPT) - 1 : -1]
    want = lp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-5)


def test_replicas_pin_a_trajectory_and_spread_new_ones(tiny_model_dir: Path) -> None:
    engines = [HFEngine(tiny_model_dir), HFEngine(tiny_model_dir)]
    rs = ReplicaSet(engines)
    a, b = rs.route("t0"), rs.route("t1")
    assert a is not b  # least loaded first
    assert rs.route("t0") is a  # sticky for the trajectory's life
    rs.release("t0")
    assert rs.route("t2") is a  # t0's slot is free again
    assert rs.routed == [2, 1]


def test_a_replica_that_fails_to_load_fails_the_whole_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rs = ReplicaSet([HFEngine(tiny_model_dir), HFEngine(tiny_model_dir)])
    bad = {"nonsense.weight": torch.zeros(2)}
    w = write_shm(tmp_path / "bad.bin", bad, version=1)
    with pytest.raises(ReplicaLoadError, match="engine-0.*engine-1"):
        rs.load_weights(1, w.uri)
    assert rs.version == 0  # nobody acked: the gate still serves v0


def test_policy_writer_keeps_the_last_versions_and_disk_only_when_asked(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = load_run_config(
        "grpo-toy",  # full versions only: the slots' cycle (deltas: tests/rollout/test_weight_delta.py)
        {"updates": 5, "checkpoint_every": 2, "publish.keep_last": 2, "publish.delta": "off"},
    )
    files = RunFiles(tmp_path)
    writer = PolicyWriter(cfg, files, str(tiny_model_dir), f"test-{tmp_path.name}")
    sd = load_model(tiny_model_dir).state_dict()
    uris = []
    for v in range(1, 6):
        uris.append(writer.write(v, sd))
        writer.prune(v)
    assert len(set(uris)) == 2  # two slots, reused in turn
    assert [read_index(ShmWeights.parse(u))["version"] for u in uris[-2:]] == [4, 5]
    with pytest.raises(WeightWireError, match="holds version 5, not 3"):
        next(iter_shm(ShmWeights.parse(uris[2]), version=3))  # v3's slot now holds v5
    on_disk = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert on_disk == ["v000004", "v000005"]  # the newest checkpointed one and the last
    writer.close()
    assert not any(ShmWeights.parse(u).path.exists() for u in uris)


def test_segments_of_dead_runs_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)
    orphan = write_shm(tmp_path / "tsrl-x-v1.bin", {"a": torch.ones(2)}, version=1, owners=(pid,))
    live = write_shm(tmp_path / "tsrl-y-v1.bin", {"a": torch.ones(2)}, version=1)
    assert sweep_orphans(tmp_path) == 1
    assert not orphan.path.exists() and live.path.exists()


def test_broadcast_reaches_every_receiver_bit_for_bit_in_buckets() -> None:
    import threading

    from thundersync.rollout.weight_broadcast import WeightBroadcaster, receive

    sd = {
        "big": torch.randn(300, 1000),  # 1.2 MB: several buckets at the small size below
        "b": torch.randn(7).to(torch.bfloat16),
        "empty": torch.empty(0, 3),
        "t": torch.randn(5, 5)[:, 1:4],  # non-contiguous
    }
    sender = WeightBroadcaster(receivers=2, timeout_s=60)
    import thundersync.rollout.weight_broadcast as wb

    old, wb.BUCKET_BYTES = wb.BUCKET_BYTES, 500_000
    try:
        uri = sender.announce(3, sd)
    finally:
        wb.BUCKET_BYTES = old
    got: dict[int, dict[str, torch.Tensor]] = {}

    def recv(rank: int) -> None:
        got[rank] = {k: v.clone() for k, v in receive(uri, rank, timeout_s=60)}

    threads = [threading.Thread(target=recv, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    sender.send(3, sd)
    for t in threads:
        t.join(60)
    assert set(got) == {1, 2}
    for back in got.values():
        assert list(back) == list(sd)
        for k, v in sd.items():
            assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
