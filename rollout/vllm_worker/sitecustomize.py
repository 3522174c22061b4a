"""Loaded by every process of a vLLM server this project starts (its PYTHONPATH is this folder).

`TSRL_VLLM_READER_SPIN_S` (set by rollout/vllm_server.py on CPU): how long vLLM's shared-memory
queue readers (the workers, the engine core) busy-spin after each message before they sleep on a
socket (vLLM: 1 s). On a CPU host the spinning processes of idle replicas take the cores that the
called replica needs: with 2 replicas on 2 cores each weight load or control call waited up to
~1 s for the spinners to give up. 0 makes readers sleep at once (a socket wake-up per message,
microseconds, against decode steps of milliseconds on CPU). A sleeping reader that misses its
wake-up (seen here: decode calls that took whole multiples of 5 s) rechecks the queue after
vLLM's `SHM_READER_RECHECK_INTERVAL_MS` (5000); with spin 0 that recheck is lowered to
`_RECHECK_MS` (an idle reader's wake-up every 50 ms costs nothing measurable).

Nothing is imported here: the patch is applied when a process imports vLLM's queue module itself
(an import hook), so helper processes that never touch vLLM start as fast as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_TARGET = "vllm.distributed.device_communicators.shm_broadcast"
_SPIN = os.environ.get("TSRL_VLLM_READER_SPIN_S")
_RECHECK_MS = 50


def _patch(module: ModuleType) -> None:
    cls = getattr(module, "SpinCondition", None)
    if cls is None:  # another vLLM version: keep its default, say so
        print("tsrl sitecustomize: no SpinCondition, reader spin not set", flush=True)
        return
    init = cls.__init__
    spin = float(_SPIN or 0)
    if spin == 0 and hasattr(module, "SHM_READER_RECHECK_INTERVAL_MS"):
        module.SHM_READER_RECHECK_INTERVAL_MS = _RECHECK_MS  # type: ignore[attr-defined]

    def patched(self: Any, *args: Any, busy_loop_s: float = spin, **kwargs: Any) -> None:
        init(self, *args, busy_loop_s=busy_loop_s, **kwargs)

    cls.__init__ = patched


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


if _SPIN is not None:
    sys.meta_path.insert(0, _PatchOnImport())
