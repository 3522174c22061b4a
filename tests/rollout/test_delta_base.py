"""`publish.delta_base: host`: the delta's base in host memory, the weights staged over in chunks
and diffed there. The published deltas (indices, values, counts) and the replicas patched from
them are bitwise the same as with the base beside the weights (`device`), through small deltas,
fallbacks to the full version, odd tails and chunk boundaries; weights on another device get a
host placement. The CUDA diff itself: tests/gpu/test_cuda_learner.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from thundersync.config import ConfigError, load_run_config
from thundersync.rollout.weight_delta import Delta, DeltaTracker
from thundersync.rollout.weight_publisher import ShmPublisher
from thundersync.rollout.weight_wire import ShmWeights, iter_delta, read_index, read_shm
from thundersync.rundir import RunFiles
from thundersync.worker.policy_writer import PolicyWriter

BF16 = torch.bfloat16
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(_INTS[t.element_size()])


def _same_delta(a: Delta | None, b: Delta | None) -> bool:
    """Two diffs' outcomes are identical: both None, or the same counts and, per tensor, the
    same indices and bitwise-same values."""
    if a is None or b is None:
        return a is b

    def counts(d: Delta) -> tuple[int, ...]:
        return d.version, d.base, d.changed, d.numel, d.nbytes, d.full_nbytes

    ca, cb = a.changes, b.changes
    return (
        counts(a) == counts(b)
        and list(ca) == list(cb)
        and all(
            torch.equal(ca[k][0], cb[k][0]) and torch.equal(_bits(ca[k][1]), _bits(cb[k][1]))
            for k in ca
        )
    )


def _odd_state(seed: int) -> dict[str, torch.Tensor]:
    """Tensors whose sizes hit every branch of `changed_indices` and of the staging chunks: one
    element, odd tails (not a multiple of 4 bf16 per int64 word), exact chunk multiples, other
    dtypes, an empty one."""
    g = torch.Generator().manual_seed(seed)
    sizes = {"one": 1, "three": 3, "seven": 7, "eight": 8, "nine": 9, "odd": 4096 + 3}
    sd = {k: torch.randn(n, generator=g).to(BF16) for k, n in sizes.items()}
    sd["mat"] = torch.randn(33, 17, generator=g).to(BF16)
    sd["f32"] = torch.randn(5, generator=g)
    sd["f64"] = torch.randn(3, generator=g).double()
    sd["u8"] = torch.randint(0, 255, (11,), generator=g, dtype=torch.uint8)
    sd["empty"] = torch.empty(0, dtype=BF16)
    return sd


def _move(sd: dict[str, torch.Tensor], frac: float, seed: int) -> dict[str, torch.Tensor]:
    """`_step` for any dtype, and the last element of every tensor always moves (the odd tail)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        w = v.clone()
        if v.numel():
            m = torch.rand(v.shape, generator=g) < frac
            m.view(-1)[-1] = True
            w[m] = (v[m].double() * 1.01 + 1).to(v.dtype) if v.is_floating_point() else v[m] + 1
        out[k] = w
    return out


def _all_move(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: t + 1 if t.dtype == torch.uint8 else (t.double() + 3).to(t.dtype) for k, t in sd.items()
    }


@pytest.mark.parametrize("stage_bytes", [8, 24, 64, 1 << 21])
def test_a_host_base_diffs_exactly_like_a_device_base_through_deltas_and_fallbacks(
    stage_bytes: int,
) -> None:
    """`publish.delta_base: host` stages the weights in chunks (here down to one int64 word, so
    chunk boundaries cut through every tensor and leave odd tails) and finds the same elements,
    the same values and the same counts as the device base, every step: small deltas, a fallback
    to the full version (every element moves), a new base after it, another set of shapes."""
    dev, host = DeltaTracker(), DeltaTracker(host=True, stage_bytes=stage_bytes)
    sd = _odd_state(0)
    for tr in (dev, host):
        assert tr.diff(1, sd) is None
        tr.acked(1, sd, None)
    assert host.base["odd"].data_ptr() != sd["odd"].data_ptr()  # a copy, not the weights
    for v in range(2, 9):
        if v == 5:  # every element moves: the delta is not smaller, the full version goes out
            sd = _all_move(sd)
        elif v == 8:  # another shape: no comparable base
            sd = {**sd, "odd": torch.zeros(4096 + 5, dtype=BF16)}
        else:
            sd = _move(sd, 0.03, v)
        got = [tr.diff(v, sd) for tr in (dev, host)]
        assert _same_delta(got[0], got[1]), v
        assert _same_delta(dev.last, host.last), v
        assert (got[1] is None) == (v in (5, 8)), v
        if got[1] is not None:
            assert got[1].changed >= len(got[1].changes) >= 9  # every odd tail moved
            assert all(i.device.type == "cpu" for i, _ in got[1].changes.values())
        for tr, d in zip((dev, host), got, strict=True):
            tr.acked(v, sd, d)
        assert all(torch.equal(_bits(host.base[k]), _bits(t)) for k, t in sd.items()), v
        assert all(host.base[k].device.type == "cpu" for k in sd)


def _apply(replica: dict[str, torch.Tensor], uri: str) -> str:
    """A replica's load of a published uri (delta: scatter; full: a copy); returns the kind."""
    seg = ShmWeights.parse(uri)
    index = read_index(seg)
    if index.get("kind") == "delta":
        for name, idx, val in iter_delta(seg, index):
            replica[name].view(-1)[idx] = val
        return "delta"
    replica.clear()
    replica.update(read_shm(seg))
    return "full"


def test_host_and_device_bases_publish_the_same_segments_and_replicas() -> None:
    """Through `ShmPublisher`: the delta segments of a host base hold the same indices and
    values as a device base's, and replicas patched from each end bitwise equal to the weights;
    a tensor of 2 MiB + 10 bytes spans two staging chunks of the default size."""
    pubs = [
        ShmPublisher(f"test-base-{where}-{os.getpid()}", host_base=where == "host")
        for where in ("device", "host")
    ]
    g = torch.Generator().manual_seed(1)
    sd = {k: t for k, t in _odd_state(1).items() if k != "u8"}  # uint8: not publishable
    sd["big"] = torch.randn((1 << 20) + 5, generator=g).to(BF16)
    replicas: list[dict[str, torch.Tensor]] = [{}, {}]
    try:
        for v in range(1, 7):
            if v == 4:
                sd = _all_move(sd)
            elif v > 1:
                sd = _move(sd, 0.01, v)
            kinds = []
            for pub, rep in zip(pubs, replicas, strict=True):
                kinds.append(_apply(rep, pub.write(v, sd)))
                pub.acked(v)
                assert all(torch.equal(_bits(rep[k]), _bits(t)) for k, t in sd.items()), v
            want = "full" if v in (1, 4) else "delta"
            assert kinds == [want, want], (v, kinds)
            assert pubs[0].last["bytes"] == pubs[1].last["bytes"]
            if want == "delta":
                segs = [p.last_segment for p in pubs]
                assert all(s is not None for s in segs)
                dumps = [list(iter_delta(s, read_index(s))) for s in segs if s is not None]
                assert [n for n, _, _ in dumps[0]] == [n for n, _, _ in dumps[1]]
                for (_, i0, v0), (_, i1, v1) in zip(*dumps, strict=True):
                    assert torch.equal(i0, i1) and torch.equal(_bits(v0), _bits(v1))
        tracker = pubs[1].tracker
        assert tracker is not None and tracker.host
        assert all(b.device.type == "cpu" for b in tracker.base.values())
    finally:
        for p in pubs:
            p.close()


def test_a_host_base_of_accelerator_weights_is_placed_in_host_memory() -> None:
    """Weights on another device (`meta` here: no data to read) get a host base of their shapes
    and dtypes: contiguous, on the cpu, nothing read from the weights and nothing allocated
    beside them; the device base stays beside them. The diff itself is tests/gpu's (CUDA)."""
    state = {
        "w": torch.empty(1000, 1024, dtype=BF16, device="meta"),
        "b": torch.empty(7, dtype=torch.float32, device="meta"),
    }
    base = DeltaTracker(host=True).place(state)
    assert {k: (t.device.type, t.shape, t.dtype) for k, t in base.items()} == {
        k: ("cpu", t.shape, t.dtype) for k, t in state.items()
    }
    assert all(t.is_contiguous() for t in base.values())
    assert sum(t.numel() * t.element_size() for t in base.values()) == 1000 * 1024 * 2 + 7 * 4
    assert all(t.device.type == "meta" for t in DeltaTracker().place(state).values())


def test_publish_delta_base_is_validated_by_name_and_reaches_the_tracker(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert load_run_config("grpo-toy").publish.delta_base == "device"
    with pytest.raises(ConfigError, match=r"publish.delta_base.*'device' or 'host'"):
        load_run_config("grpo-toy", {"publish.delta_base": "gpu"})
    for where in ("device", "host"):
        cfg = load_run_config("grpo-toy", {"publish.delta_base": where, "publish.delta": "on"})
        writer = PolicyWriter(cfg, RunFiles(tmp_path), str(tiny_model_dir), f"t-{where}")
        try:
            assert writer.shm.tracker is not None and writer.shm.tracker.host is (where == "host")
        finally:
            writer.close()
