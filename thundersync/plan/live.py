"""Live tensor bytes on any device, CPU included: `LiveBytes`, the allocator-free meter.

Why: the plan's checkpointed terms are what a forward *keeps* (checkpoint regions hold their
inputs in closures, not as autograd saved tensors, so saved-tensor hooks do not see them), and
CPU has no `max_memory_allocated`. This mode counts every storage an op creates while active,
until the last tensor on it dies (torch keeps a tensor's Python object alive as long as C++ holds
it, so a weakref finalizer fires when the storage's last user goes). Storages made before the mode
(parameters, leaves) are not counted, nor are views or in-place results on them: an output whose
storage is an input's untracked storage is a pre-existing one, not a new allocation.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.users: dict[int, int] = {}  # storage pointer -> live tensors on it
        self.size: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def _drop(self, key: int) -> None:
        self.users[key] -= 1
        if self.users[key] == 0:
            self.live -= self.size.pop(key)
            del self.users[key]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or (key in inputs and key not in self.users):
                continue  # a view / in-place result of a storage made before the mode
            if key not in self.users:
                self.users[key] = 0
                self.size[key] = storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            self.users[key] += 1
            weakref.finalize(t, self._drop, key)
        return out

    def settled(self) -> int:
        """Live bytes once garbage cycles are collected."""
        gc.collect()
        return self.live
