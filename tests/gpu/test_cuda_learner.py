"""The learner on CUDA for real (skipped without a GPU; `deploy/gpu-smoke.sh` runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_schedules_are_equal_on_cuda_in_fp32(objective: str) -> None:
    from thundersync.bench.equivalence import run_equivalence
    from thundersync.config import Objective

    res = run_equivalence(Objective(objective), updates=4, device="cuda")
    assert res["max_param_gap"] <= 1e-6, res


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_bf16_on_cuda_steps_fp32_master_weights_within_the_paper_bound(objective: str) -> None:
    from thundersync.bench.equivalence import run_equivalence
    from thundersync.config import Objective

    res = run_equivalence(Objective(objective), updates=4, dtype="bfloat16", device="cuda")
    assert res["master_dtype"] == "float32" and res["compute_dtype"] == "bfloat16"
    assert res["max_param_gap"] <= 6e-5, res
    assert res["max_gap_vs_fp32_sync"] >= 100 * res["max_param_gap"], res


def test_device_accumulators_equal_host_accumulators_on_cuda() -> None:
    """learner.accum_device=device (sums on the GPU) gives the host-accumulator update; it crashed
    on the first GPU run (a bare `cuda` compared unequal to the tensors' `cuda:0`)."""
    import random

    from thundersync.bench.gpu_checks import SMALL, _long_batch, _model
    from thundersync.config import Schedule, load_run_config
    from thundersync.learner.batch_replay import replay_update
    from thundersync.learner.trainer import Learner

    batch = _long_batch(random.Random(2), 512, 16, 32)
    grads = []
    for acc in ("host", "device"):
        torch.manual_seed(0)
        cfg = load_run_config(
            data={"learner": {"device": "cuda", "accum_device": acc, "max_open_groups": 2}}
        )
        learner = Learner(_model(SMALL, 512, torch.float32), cfg)
        grads.append(replay_update(learner, batch, Schedule.STREAM).grad.double().cpu())
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-7)
    assert grads[1].norm() > 0


def test_host_placed_optimizer_keeps_master_and_moments_off_the_gpu() -> None:
    """learner.optimizer_device=host: the bf16 replica on the GPU, the fp32 master copy and its
    AdamW moments on the host; the parameters after the step are the device-placed ones."""
    import random

    from thundersync.bench.gpu_checks import SMALL, _long_batch, _model
    from thundersync.config import Schedule, load_run_config
    from thundersync.learner.batch_replay import replay_update
    from thundersync.learner.trainer import Learner

    batch = _long_batch(random.Random(2), 512, 16, 32)
    learners = {}
    for where in ("device", "host"):
        torch.manual_seed(0)
        cfg = load_run_config(data={"learner": {"device": "cuda", "optimizer_device": where}})
        learners[where] = Learner(_model(SMALL, 512, torch.bfloat16), cfg)
        replay_update(learners[where], batch, Schedule.STREAM)
    host = learners["host"]
    assert {p.device.type for p in host.params} == {"cuda"}
    assert {m.device.type for m in host.optimizer.master} == {"cpu"}
    moments = [t for st in host.optimizer.opt.state.values() for t in st.values() if t.dim()]
    assert moments and {t.device.type for t in moments} == {"cpu"}
    assert torch.equal(host.flat_params(), learners["device"].flat_params())


def test_deterministic_mode_gives_the_same_bits_twice() -> None:
    from thundersync.bench.gpu_checks import determinism_check

    assert determinism_check("cuda", deterministic=True)["bitwise_equal"]


def test_half_billion_parameter_update_fits_and_reports_peak_memory() -> None:
    from thundersync.bench.gpu_checks import memory_check

    res = memory_check("cuda")
    assert 0.4 <= res["params_b"] <= 0.6 and res["master_dtype"] == "float32"
    assert 0 < res["peak_gb_sync"] < 60 and 0 < res["peak_gb_stream"] < 60, res


def test_cuda_weights_publish_to_shared_memory_bit_for_bit(tmp_path: Path) -> None:
    """The shared-memory publish takes the learner's CUDA tensors (it called .numpy() on them)."""
    from thundersync.rollout.weight_wire import read_shm, write_shm

    sd = {"a": torch.randn(64, 8, device="cuda"), "b": torch.randn(5, device="cuda").bfloat16()}
    back = read_shm(write_shm(tmp_path / "seg.bin", sd, version=1))
    assert all(torch.equal(back[k], v.cpu()) for k, v in sd.items())


@pytest.mark.parametrize("delta_base", ["device", "host"])
def test_auto_delta_publish_of_cuda_weights_is_bitwise_and_small(delta_base: str) -> None:
    """`publish.delta: auto` diffs weights on the GPU: a few elements move per step, the delta
    carries them (indices + values) and a host replica patched from it equals the weights.
    `publish.delta_base: host`: the same deltas, with no base and no full-size transient on the
    GPU (its allocations stay under a quarter of the weights), the staging buffer pinned."""
    import os

    from thundersync.rollout.weight_publisher import ShmPublisher
    from thundersync.rollout.weight_wire import ShmWeights, iter_delta, read_index

    master = {
        "w": torch.randn(1 << 20, device="cuda") * 0.02,
        "b": torch.randn(4096, device="cuda"),
    }
    host = delta_base == "host"
    shm = ShmPublisher(f"test-gpu-delta-{os.getpid()}", from_host=False, host_base=host)
    tracker = shm.tracker
    assert tracker is not None
    try:
        state = {k: v.bfloat16() for k, v in master.items()}
        full = sum(v.numel() * v.element_size() for v in state.values())
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        shm.write(1, state)
        shm.acked(1)
        grew = torch.cuda.max_memory_allocated() - before
        assert {b.device.type for b in tracker.base.values()} == {"cpu" if host else "cuda"}
        assert grew < full // 4 if host else grew >= full, (grew, full)
        replica = {k: v.cpu() for k, v in state.items()}
        for version in (2, 3):
            for t in master.values():
                t.add_(torch.sign(torch.randn_like(t)) * 1e-6)
            state = {k: v.bfloat16() for k, v in master.items()}
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            seg = ShmWeights.parse(shm.write(version, state))
            if host:  # the diff ran on the host: the GPU held no copy of the weights meanwhile
                assert torch.cuda.max_memory_allocated() - before < full // 4
                assert tracker._stage is not None and tracker._stage.is_pinned()
            index = read_index(seg)
            assert index["kind"] == "delta" and shm.last["bytes"] < 0.3 * shm.last["full_bytes"]
            for name, idx, val in iter_delta(seg, index):
                replica[name].view(-1)[idx] = val
            shm.acked(version)
            assert all(torch.equal(replica[k], v.cpu()) for k, v in state.items())
    finally:
        shm.close()


def test_host_and_device_bases_find_the_same_delta_of_cuda_weights() -> None:
    """`publish.delta_base: host` copies CUDA weights to the host in chunks (pinned staging) and
    diffs there: the same indices and bitwise-same values as the diff on the GPU, for a tensor
    spanning two chunks with an odd tail and for tiny ones; after the acks the bases agree."""
    from thundersync.rollout.weight_delta import DeltaTracker

    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = {"big": (1 << 20) + 5, "odd": 4099, "three": 3, "one": 1}
    sd = {k: torch.randn(n, device="cuda", generator=g).bfloat16() for k, n in sizes.items()}
    dev, host = DeltaTracker(), DeltaTracker(host=True)
    for tr in (dev, host):
        tr.acked(1, sd, None)
    for version in (2, 3, 4):
        moved = {}
        for k, v in sd.items():
            m = torch.rand(v.shape, device="cuda", generator=g) < 0.02
            m[-1] = True  # the odd tail moves
            flipped = (v.view(torch.int16) ^ 1).view(torch.bfloat16)  # one ulp: always moves
            moved[k] = torch.where(m, flipped, v)
        sd = moved
        a, b = dev.diff(version, sd), host.diff(version, sd)
        assert a is not None and b is not None and a.changed == b.changed
        assert list(a.changes) == list(b.changes) == list(sd)
        for k, (idx, val) in a.changes.items():
            hidx, hval = b.changes[k]
            assert hidx.device.type == "cpu" and torch.equal(idx.cpu(), hidx)
            assert torch.equal(val.cpu().view(torch.int16), hval.view(torch.int16))
        dev.acked(version, sd, a)
        host.acked(version, sd, b)
        for k, v in sd.items():
            assert torch.equal(host.base[k].view(torch.int16), v.cpu().view(torch.int16))
            assert torch.equal(dev.base[k].cpu().view(torch.int16), host.base[k].view(torch.int16))


def test_mfu_peak_on_cuda_is_the_datasheet_bf16_peak() -> None:
    """MFU's peak on a listed GPU: its datasheet dense bf16 peak, which a measured 8192-wide
    bf16 product approaches from below (bf16 at least 5x fp32)."""
    from thundersync.peak import measured_peak_flops, mfu_peak, table_peak

    device = torch.device("cuda", 0)
    peak, source = mfu_peak(None, device, torch.float32)
    listed = table_peak(torch.cuda.get_device_name(device))
    bf16 = measured_peak_flops("cuda", threads=1, dtype=torch.bfloat16)
    fp32 = measured_peak_flops("cuda", threads=1)
    assert bf16 > 5 * fp32 and bf16 > 1e14, (bf16, fp32)
    if listed is not None:
        assert peak == listed and "datasheet" in source and bf16 <= 1.05 * listed, (bf16, peak)
    else:
        assert "measured" in source
