"""The version gate: no request for policy version k+1 reaches an engine before it acknowledged k+1.

Zero staleness rests on this: every rollout of update k must be sampled from theta_k. A request
carries the version it was made for; the gate blocks it until the engine has acknowledged that
version, and refuses a request for a version older than the one being served (it would silently be
answered by newer weights). Loads wait for in-flight requests to drain, so weights never change
under a running generation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StaleRequestError(RuntimeError):
    """A request asked for a policy version older than the one the engine serves."""


class VersionTimeoutError(TimeoutError):
    """The engine did not acknowledge the requested version in time."""


class VersionGate:
    def __init__(self, version: int = 0) -> None:
        self._version = version
        self._in_flight = 0
        self._loading = False
        self._cv = threading.Condition()

    @property
    def version(self) -> int:
        return self._version

    @contextmanager
    def request(self, version: int | None, timeout_s: float = 600.0) -> Iterator[int]:
        """Hold the gate for one request of `version` (None: whatever is served now)."""
        with self._cv:
            floor = self._version if version is None else version
            ok = self._cv.wait_for(
                lambda: not self._loading and self._version >= floor, timeout=timeout_s
            )
            # None: the version served once no load is under way (one may finish while it waits)
            want = self._version if version is None else version
            if not ok:
                raise VersionTimeoutError(
                    f"engine still serves version {self._version}, request wants {want}: "
                    f"was publish({want}) called and acknowledged?"
                )
            if self._version != want:
                raise StaleRequestError(
                    f"request for policy version {want} but the engine serves {self._version}: "
                    "a lossless schedule must finish every rollout of an update before publishing"
                )
            self._in_flight += 1
        try:
            yield want
        finally:
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    @contextmanager
    def loading(self, version: int, timeout_s: float = 600.0) -> Iterator[None]:
        """Exclusive section for a weight load; acknowledges `version` only if the body succeeds."""
        with self._cv:
            if version < self._version:
                raise ValueError(
                    f"cannot load version {version}: the engine already serves {self._version}"
                )
            if not self._cv.wait_for(
                lambda: self._in_flight == 0 and not self._loading, timeout=timeout_s
            ):
                raise VersionTimeoutError("in-flight requests did not drain before a weight load")
            self._loading = True
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cv:
                self._loading = False
                if ok:
                    self._version = version
                self._cv.notify_all()
