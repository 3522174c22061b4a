"""The OPD K/V store: growth stops at the run's token limit and regrows a layer at a time.

The plan counts T positions per open trajectory (`rollout.max_total_tokens`), not the 2T a
doubling reaches; a turn that needs more than the limit still gets it (never a refused turn).
"""

from __future__ import annotations

import torch

from thundersync.learner.accumulators import BufferPool
from thundersync.learner.kvstore import KVStore
from thundersync.plan.live import LiveBytes

LAYERS, HEADS, DIM = 3, 2, 4


def _turn(n: int, value: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (torch.full((1, HEADS, n, DIM), value + i), torch.full((1, HEADS, n, DIM), -value - i))
        for i in range(LAYERS)
    ]


def _bytes_per_position() -> int:
    return LAYERS * 2 * HEADS * DIM * (4 + 4)  # K and V in fp32 plus their fp32 ledgers


def test_growth_stops_at_the_limit_and_keeps_every_position() -> None:
    pool = BufferPool("cpu")
    store = KVStore(pool, limit=130)
    store.append(_turn(128, 1.0))
    assert store.capacity == 128
    store.append(_turn(2, 2.0))  # doubling would give 256
    assert store.capacity == 130
    assert pool.peak_held_bytes == 130 * _bytes_per_position()
    past = store.past(130)
    assert torch.equal(past[1][0][:, :, :128], torch.full((1, HEADS, 128, DIM), 2.0))
    assert torch.equal(past[1][0][:, :, 128:], torch.full((1, HEADS, 2, DIM), 3.0))
    store.append(_turn(5, 4.0))  # past the limit: the turn still fits, exactly
    assert store.capacity == 135 and store.length == 135


def test_without_a_limit_the_store_doubles() -> None:
    store = KVStore(BufferPool("cpu"))
    store.append(_turn(128, 1.0))
    store.append(_turn(2, 2.0))
    assert store.capacity == 256


def test_regrowth_holds_one_old_layer_at_a_time() -> None:
    store = KVStore(BufferPool("cpu"), limit=1024)
    old, new = 256 * _bytes_per_position(), 512 * _bytes_per_position()
    with LiveBytes() as meter:
        store.append(_turn(256, 1.0))
        store.append(_turn(1, 2.0))  # 256 -> 512 positions
    # the new buffers and at most one old layer beside them (all old ones at once: old + new)
    assert new <= meter.peak <= new + old // LAYERS + 2 * _bytes_per_position()
