"""`LiveBytes` counts the storages ops create, not views or in-place results on older ones."""

from __future__ import annotations

import torch

from thundersync.plan.live import LiveBytes


def test_views_and_in_place_results_of_pre_existing_storages_are_not_counted() -> None:
    weight = torch.zeros(1024, 256)  # made before the meter: a parameter, a resident buffer
    with LiveBytes() as meter:
        flat = weight.view(-1)
        rows = weight[:10]
        weight.add_(1.0)
        flat.mul_(2.0)
        assert meter.live == 0, "a view / in-place op on a resident tensor counted as allocated"
        fresh = weight * 3.0  # a new storage: counted, and released when it dies
        assert meter.live == fresh.untyped_storage().nbytes()
        alias = fresh.view(-1)  # a view of a counted storage keeps it counted once
        del fresh
        assert meter.live == alias.untyped_storage().nbytes()
        del alias
        assert meter.settled() == 0
    assert meter.peak == 1024 * 256 * 4
    assert rows.shape == (10, 256)
