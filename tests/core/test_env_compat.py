"""The old `THUNDERSYNC_` names still work, once, with a visible deprecation warning."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from thundersync.env_compat import LegacyEnvWarning, adopt_legacy_env


def test_old_name_is_read_into_the_new_one_with_a_warning() -> None:
    env = {"THUNDERSYNC_CACHE": "/c", "THUNDERSYNC_POOL_SIZE": "4", "TSRL_POOL_SIZE": "8"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = adopt_legacy_env(env)
    assert moved == {"THUNDERSYNC_CACHE": "TSRL_CACHE", "THUNDERSYNC_POOL_SIZE": "TSRL_POOL_SIZE"}
    assert env["TSRL_CACHE"] == "/c"
    assert env["TSRL_POOL_SIZE"] == "8"  # the new name wins
    texts = [str(w.message) for w in caught if issubclass(w.category, LegacyEnvWarning)]
    assert any("THUNDERSYNC_CACHE is deprecated" in t and "TSRL_CACHE" in t for t in texts)
    assert any("ignored: TSRL_POOL_SIZE is set" in t for t in texts)


def test_importing_the_package_applies_it_and_the_warning_shows_by_default(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TSRL_", "THUNDERSYNC_"))}
    env["THUNDERSYNC_CACHE"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", "import thundersync.cache as c; print(c.cache_root())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path)
    assert "LegacyEnvWarning: THUNDERSYNC_CACHE is deprecated" in out.stderr
