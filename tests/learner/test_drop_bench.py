"""`tsrl bench equivalence --masked`: batches that lose rows mid-update (a GRPO member, a group
left below the minimum, an OPD trajectory after its first turns) replay bitwise equal through
sync / group / stream, and equal to a sync replay of the clean masked batch."""

from __future__ import annotations

import pytest

from thundersync.bench.equivalence import run_equivalence
from thundersync.config import Objective


@pytest.mark.parametrize("objective", [Objective.GRPO, Objective.OPD])
def test_masked_equivalence_bench(objective: Objective) -> None:
    res = run_equivalence(objective, updates=2, masked=True)
    assert res["masked"] and res["goal_met"]
    assert res["max_param_gap"] == 0.0 and res["masked_param_gap"] == 0.0
    # the textbook trainer on the masked batch stays at the fp32 floor of the unmasked bench
    assert res["reference_grad_rel_err"] < 1e-4
