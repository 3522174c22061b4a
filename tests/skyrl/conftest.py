"""skyrl 0.4.0 needs `thundersync.skyrl.compat` before its first import on Python 3.11; pytest
loads this file before the test modules, so they import skyrl like any dependency."""

import thundersync.skyrl  # noqa: F401
