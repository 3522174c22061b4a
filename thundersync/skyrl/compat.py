"""Python 3.11 support for skyrl 0.4.0, applied before the first `import skyrl`.

skyrl 0.4.0 declares Python >= 3.12, and one thing stops it on 3.11: pydantic refuses a
`typing.TypedDict` field below 3.12 (`skyrl/tinker/types.py`, imported by `skyrl.backends` and
through it by the trainers). `typing_extensions.TypedDict` is the same class pydantic accepts, so
`typing.TypedDict` is pointed at it for this process. Drop this module when the project's floor
is Python 3.12 (GPU nodes already run 3.12, where it does nothing).
"""

from __future__ import annotations

import sys
import typing


def prepare() -> None:
    """Make `import skyrl...` work on this interpreter (idempotent; a no-op on >= 3.12)."""
    if sys.version_info >= (3, 12):
        return
    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc,assignment]
