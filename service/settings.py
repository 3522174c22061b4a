"""Service settings: one frozen object built from CLI options and TSRL_* environment variables.

Kept apart from the app so tests build a `Settings` directly (a throwaway database, a stand-in
driver command) without touching the environment.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_UPLOAD_BYTES = 16 << 30  # one uploaded file (a model's safetensors)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # bus.factory's default broker


def default_driver_command() -> list[str]:
    """`<venv>/bin/tsrl train` next to this interpreter, else `python -m thundersync.cli train`."""
    exe = Path(sys.executable).parent / "tsrl"
    if exe.exists():
        return [str(exe), "train"]
    return [sys.executable, "-m", "thundersync.cli", "train"]


def normalize_database_url(url: str) -> str:
    """Accept `postgres://` / `postgresql://` and pick the psycopg 3 driver for them."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class AdminTokenError(ValueError):
    """The admin token cannot be read: the message says which setting and how to fix it."""


def read_admin_token(
    token_file: Path | str | None = None, env: Mapping[str, str] | None = None
) -> tuple[str | None, list[str]]:
    """The admin token and any warnings: from a file (`--admin-token-file` or
    TSRL_ADMIN_TOKEN_FILE), else from TSRL_ADMIN_TOKEN; never from the command line, where every
    user of the machine sees it (ps, /proc/PID/cmdline). The file holds the token alone (one
    line; surrounding whitespace is dropped)."""
    env = os.environ if env is None else env
    token_file = token_file or env.get("TSRL_ADMIN_TOKEN_FILE") or None
    from_env = env.get("TSRL_ADMIN_TOKEN") or None
    if token_file is None:
        return from_env, _short(from_env)
    if from_env is not None:
        raise AdminTokenError(
            "the admin token is given twice (TSRL_ADMIN_TOKEN and --admin-token-file / "
            "TSRL_ADMIN_TOKEN_FILE): keep one of them"
        )
    path = Path(token_file)
    try:
        token = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as err:
        raise AdminTokenError(f"admin token file {path}: cannot read it ({err})") from None
    if not token or any(c.isspace() for c in token):
        raise AdminTokenError(
            f"admin token file {path}: must hold the token alone, on one line, without spaces"
        )
    warnings = _short(token)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(f"admin token file {path} is readable by other users: chmod 600 it")
    return token, warnings


def _short(token: str | None) -> list[str]:
    if token is not None and len(token) < 16:
        return [f"the admin token has {len(token)} characters: use 32 or more random ones"]
    return []


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("runs/service")
    database_url: str | None = None
    admin_token: str | None = None
    launcher: str = "embedded"  # "embedded" (subprocess) or "ray" (Ray job submission)
    ray_address: str | None = None
    max_concurrent_runs: int = 1
    # runs one token may have queued / starting / running at once (0: no limit); a token's own
    # `max_active_runs` (set when an admin creates it) wins
    max_active_runs_per_token: int = 8
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    # where drivers' Redis Streams buses live (TSRL_REDIS_URL, as for the driver): the launcher
    # deletes a dead run's keys there; None skips that
    redis_url: str | None = DEFAULT_REDIS_URL
    poll_interval_s: float = 0.5
    cancel_grace_s: float = 600.0
    stop_runs_on_exit: bool = True
    driver_command: list[str] = field(default_factory=default_driver_command)

    @property
    def db_url(self) -> str:
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{self.data_dir.resolve() / 'tsrl.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir.resolve() / "runs"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Environment first (TSRL_HOST, TSRL_PORT, TSRL_DATABASE_URL, TSRL_ADMIN_TOKEN or
        TSRL_ADMIN_TOKEN_FILE, TSRL_DATA_DIR, TSRL_LAUNCHER, TSRL_RAY_ADDRESS,
        TSRL_MAX_CONCURRENT_RUNS), then explicit keyword overrides that are not None."""
        env = os.environ
        values: dict[str, object] = {}
        if "TSRL_HOST" in env:
            values["host"] = env["TSRL_HOST"]
        if "TSRL_PORT" in env:
            values["port"] = int(env["TSRL_PORT"])
        if "TSRL_DATA_DIR" in env:
            values["data_dir"] = Path(env["TSRL_DATA_DIR"])
        values["admin_token"] = read_admin_token(env=env)[0]
        for key, name in (
            ("database_url", "TSRL_DATABASE_URL"),
            ("launcher", "TSRL_LAUNCHER"),
            ("ray_address", "TSRL_RAY_ADDRESS"),
            ("redis_url", "TSRL_REDIS_URL"),
        ):
            if env.get(name):
                values[key] = env[name]
        for key, name in (
            ("max_concurrent_runs", "TSRL_MAX_CONCURRENT_RUNS"),
            ("max_active_runs_per_token", "TSRL_MAX_ACTIVE_RUNS_PER_TOKEN"),
        ):
            if name in env:
                values[key] = int(env[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
