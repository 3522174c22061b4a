"""Loaded by every process of a vLLM server this project starts (its PYTHONPATH is this folder).

`TSRL_VLLM_READER_SPIN_S` (set by rollout/vllm_server.py on CPU): how long vLLM's shared-memory
queue readers (the workers, the engine core) busy-spin after each message before they sleep on a
socket (vLLM: 1 s). On a CPU host the spinning processes of idle replicas take the cores that the
called replica needs: with 2 replicas on 2 cores each weight load or control call waited up to
~1 s for the spinners to give up. 0 makes readers sleep at once (a socket wake-up per message,
microseconds, against decode steps of milliseconds on CPU).
"""

from __future__ import annotations

import importlib.util
import os

_SPIN = os.environ.get("TSRL_VLLM_READER_SPIN_S")

# (helper processes of another interpreter may share the PYTHONPATH: nothing to patch there)
if _SPIN is not None and importlib.util.find_spec("vllm") is not None:
    try:
        from vllm.distributed.device_communicators import shm_broadcast

        _init = shm_broadcast.SpinCondition.__init__

        def _patched(self, *args, busy_loop_s: float = float(_SPIN), **kwargs):  # type: ignore[no-untyped-def]
            _init(self, *args, busy_loop_s=busy_loop_s, **kwargs)

        shm_broadcast.SpinCondition.__init__ = _patched  # type: ignore[method-assign]
    except Exception as e:  # noqa: BLE001 - another vLLM version: keep its default, say so
        print(f"tsrl sitecustomize: reader spin not set ({type(e).__name__}: {e})", flush=True)
