"""The OPD K/V store: growth stops at the run's token limit and regrows a layer at a time.

The plan counts T positions per open trajectory (`rollout.max_total_tokens`), not the 2T a
doubling reaches; a turn that needs more than the limit still gets it (never a refused turn).
"""

from __future__ import annotations

import torch

from thundersync.learner.accumulators import BufferPool
from thundersync.learner.engine_core import flat_kv
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


def test_store_hooks_add_into_the_ledger_regrown_after_the_leaves_were_made() -> None:
    """A kept graph's leaves predate a regrowth: their adjoints land in the new ledger (positions
    [:upto] only, accumulated over backwards), never in the replaced one; leaf grads stay None."""
    store = KVStore(BufferPool("cpu"))
    store.append(_turn(10, 1.0))
    leaves = flat_kv(store.past(10))
    old = [buf for layer in store.ledger for buf in layer]
    store.append(_turn(20, 2.0))  # 16 -> 32 positions: new K/V and ledger buffers
    assert all(a is not b for a, b in zip(old, (x for la in store.ledger for x in la), strict=True))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(x.shape, generator=gen) for x in leaves]
    for _ in range(2):
        sum((w * x).sum() for w, x in zip(weights, leaves, strict=True)).backward()
    new = [buf for layer in store.ledger for buf in layer]
    for w, x, buf, was in zip(weights, leaves, new, old, strict=True):
        assert x.grad is None
        assert torch.equal(buf[:, :, :10], 2 * w)
        assert not buf[:, :, 10:].any() and not was.any()


def test_a_backward_through_store_leaves_holds_one_leaf_adjoint_at_a_time() -> None:
    """Each leaf's grad is added to the ledger and freed as it arrives, not all kept until the
    backward ends: when any leaf's adjoint comes in, no other leaf holds one."""
    store = KVStore(BufferPool("cpu"))
    store.append(_turn(6, 1.0))
    leaves = flat_kv(store.past(6))
    alive: list[int] = []

    def probe(_: torch.Tensor) -> None:
        alive.append(sum(x.grad is not None for x in leaves))

    for x in leaves:
        x.register_hook(probe)
    h = torch.zeros(())
    for x in leaves:  # a chain: the adjoints arrive one after another
        h = torch.tanh(h + (x * x).sum() * 1e-3)
    h.backward()
    assert len(alive) == len(leaves) and max(alive) == 0
    assert all(x.grad is None for x in leaves)
    assert all(buf[:, :, :6].any() for layer in store.ledger for buf in layer)
