"""The learner's devices compare equal to the devices its tensors report.

`torch.device("cuda") != torch.device("cuda:0")`: with a bare `cuda`, the gradient router took
device accumulators for host ones and added host-staged gradients into CUDA sums (found on the
first GPU run; tests/gpu runs the real thing). Off a GPU, `torch.cuda.current_device` is stood in
for the device index CUDA would report."""

from __future__ import annotations

import pytest
import torch

from thundersync.learner.device import accumulator_device, canonical_device


def test_bare_cuda_takes_the_current_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert canonical_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert canonical_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert accumulator_device("device", torch.device("cuda")) == torch.device("cuda", 3)
    assert accumulator_device("host", torch.device("cuda")) == torch.device("cpu")


@pytest.mark.parametrize("kind", ["cpu", "meta"])
def test_other_devices_are_kept(kind: str) -> None:
    d = torch.device(kind)
    assert canonical_device(d) == d == torch.empty(1, device=kind).device
    assert accumulator_device("device", d) == d
