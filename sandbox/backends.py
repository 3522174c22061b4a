"""`get_executor`: the factory that picks a sandbox backend by name.

Apart from `sandbox.executor` (the seam's types) because it imports both backends, which
themselves import the seam: one module on top of them, not a cycle through the seam.
"""

from __future__ import annotations

from typing import Any

from thundersync.sandbox.executor import Backend, Executor, SandboxError


def get_executor(backend: Backend | str, **kwargs: Any) -> Executor:
    """The executor for `backend` ("local" or "docker")."""
    try:
        name = Backend(backend)
    except ValueError:
        raise SandboxError(
            f"unknown sandbox backend {backend!r}; expected one of {[b.value for b in Backend]}"
        ) from None
    # imported on demand: a local run never loads the docker backend (nor the reverse)
    if name is Backend.LOCAL:
        from thundersync.sandbox.local import LocalExecutor

        return LocalExecutor(**kwargs)
    from thundersync.sandbox.docker_backend import DockerExecutor

    return DockerExecutor(**kwargs)
