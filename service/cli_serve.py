"""`tsrl serve`: run the control plane (API + dashboard + launcher) with uvicorn.

The admin token comes from TSRL_ADMIN_TOKEN or a file (`--admin-token-file`, TSRL_ADMIN_TOKEN_FILE),
never from the command line, which every user of the machine can read (ps, /proc/PID/cmdline).
Log lines never show a secret: tokens in query strings, generated `tsrl_...` tokens and the
configured admin token are replaced by `[redacted]`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

import typer

from thundersync.cli_groups import app

_SECRET_QS = re.compile(r"((?:access_)?token=)[^&\s\"]+", re.IGNORECASE)
_GENERATED = re.compile(r"tsrl_[A-Za-z0-9_-]{16,}")
REDACTED = "[redacted]"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


class RedactTokens(logging.Filter):
    """Log records never show a token: one passed in a query string (`?token=...`), a generated
    one (`tsrl_...`), or any of `secrets` (the configured admin token)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if len(s) >= 4]  # shorter would mangle every line

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _SECRET_QS.sub(r"\1" + REDACTED, text)
        return _GENERATED.sub(REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        record.msg = self.redact(str(record.msg))
        return True


def install_redaction(secrets: Iterable[str] = ()) -> RedactTokens:
    """Redact on the root handlers and on uvicorn's loggers (which do not propagate to root)."""
    redact = RedactTokens(secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redact)
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).addFilter(redact)
    return redact


@app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", envvar="TSRL_HOST", help="interface to listen on"),
    port: int = typer.Option(8000, envvar="TSRL_PORT"),
    database_url: str = typer.Option(
        None,
        envvar="TSRL_DATABASE_URL",
        help="e.g. postgresql://postgres@127.0.0.1:5432/tsrl; default: SQLite under --data-dir",
    ),
    admin_token_file: Path = typer.Option(
        None,
        envvar="TSRL_ADMIN_TOKEN_FILE",
        dir_okay=False,
        help="file holding the admin token (stored hashed); or set TSRL_ADMIN_TOKEN",
    ),
    admin_token: str = typer.Option(
        None, "--admin-token", hidden=True, help="refused: a token on argv is visible to all"
    ),
    data_dir: Path = typer.Option(
        Path("runs/service"), envvar="TSRL_DATA_DIR", help="SQLite file and run directories"
    ),
    launcher: str = typer.Option(
        "embedded", envvar="TSRL_LAUNCHER", help="embedded (subprocess) or ray (Ray jobs)"
    ),
    ray_address: str = typer.Option(None, envvar="TSRL_RAY_ADDRESS", help="Ray dashboard URL"),
    max_concurrent_runs: int = typer.Option(1, envvar="TSRL_MAX_CONCURRENT_RUNS", min=1),
    max_active_runs_per_token: int = typer.Option(
        8,
        envvar="TSRL_MAX_ACTIVE_RUNS_PER_TOKEN",
        min=0,
        help="runs one token may have queued or running at once (0: no limit); past it POST "
        "/runs answers 429",
    ),
    redis_url: str = typer.Option(
        "redis://127.0.0.1:6379/0",
        envvar="TSRL_REDIS_URL",
        help="the drivers' Redis broker: a dead run's streams are deleted there",
    ),
    keep_runs_on_exit: bool = typer.Option(
        False, help="leave drivers running when the service stops (adopted on restart)"
    ),
) -> None:
    """Serve the REST API (/api/v1, docs at /docs) and the live dashboard (/).

    The admin token: TSRL_ADMIN_TOKEN=... or --admin-token-file PATH (never on the command line)."""
    import uvicorn

    from thundersync.service.main import create_app
    from thundersync.service.settings import AdminTokenError, Settings, read_admin_token

    if admin_token is not None:
        typer.echo(
            "--admin-token is not accepted: the command line is visible to every user of this "
            "machine (ps, /proc). Set TSRL_ADMIN_TOKEN, or put the token in a file (chmod 600) "
            "and pass --admin-token-file PATH (or TSRL_ADMIN_TOKEN_FILE).",
            err=True,
        )
        raise typer.Exit(2)
    if launcher not in ("embedded", "ray"):
        typer.echo(f"--launcher {launcher!r} unknown: use 'embedded' or 'ray'", err=True)
        raise typer.Exit(2)
    try:
        token, warnings = read_admin_token(admin_token_file)
    except AdminTokenError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    settings = Settings(
        host=host,
        port=port,
        data_dir=data_dir,
        database_url=database_url,
        admin_token=token,
        launcher=launcher,
        ray_address=ray_address,
        max_concurrent_runs=max_concurrent_runs,
        max_active_runs_per_token=max_active_runs_per_token,
        redis_url=redis_url or None,
        stop_runs_on_exit=not keep_runs_on_exit,
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    install_redaction([token] if token else [])
    for warning in warnings:
        logging.getLogger("tsrl.service").warning("%s", warning)
    typer.echo(
        f"ThunderSync service on http://{host}:{port}/ (database: {settings.db_url.split('://')[0]})"
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
