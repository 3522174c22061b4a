"""One environment prefix: `TSRL_`. The names of the old `THUNDERSYNC_` prefix are read once, when
the package is imported, into their `TSRL_` names with a deprecation warning; a `TSRL_` name that is
already set wins. Child processes inherit the new names, so nothing else reads the old ones."""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping

LEGACY_PREFIX = "THUNDERSYNC_"
PREFIX = "TSRL_"


class LegacyEnvWarning(DeprecationWarning):
    """A `THUNDERSYNC_*` variable was set; it is shown by default (users must see it)."""


warnings.simplefilter("default", LegacyEnvWarning)


def adopt_legacy_env(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Copy every `THUNDERSYNC_X` to `TSRL_X` (unless set) and warn; returns old -> new names."""
    moved: dict[str, str] = {}
    for old in sorted(k for k in environ if k.startswith(LEGACY_PREFIX)):
        new = PREFIX + old.removeprefix(LEGACY_PREFIX)
        if new in environ:
            hint = f"{old} is deprecated and ignored: {new} is set (unset {old})"
        else:
            environ[new] = environ[old]
            hint = f"{old} is deprecated: read as {new}; rename it to {new}"
        warnings.warn(hint, LegacyEnvWarning, stacklevel=2)
        moved[old] = new
    return moved
