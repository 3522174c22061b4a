"""`tsrl serve`: run the control plane (API + dashboard + launcher) with uvicorn."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import typer

from tsrl.cli_groups import app

_SECRET_QS = re.compile(r"((?:access_)?token=)[^&\s\"]+", re.IGNORECASE)


class RedactTokens(logging.Filter):
    """Access-log lines never show a token passed in a query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _SECRET_QS.sub(r"\1[redacted]", a) if isinstance(a, str) else a for a in record.args
            )
        record.msg = _SECRET_QS.sub(r"\1[redacted]", str(record.msg))
        return True


@app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", envvar="TSRL_HOST", help="interface to listen on"),
    port: int = typer.Option(8000, envvar="TSRL_PORT"),
    database_url: str = typer.Option(
        None,
        envvar="TSRL_DATABASE_URL",
        help="e.g. postgresql://postgres@127.0.0.1:5432/tsrl; default: SQLite under --data-dir",
    ),
    admin_token: str = typer.Option(
        None, envvar="TSRL_ADMIN_TOKEN", help="bearer token with admin rights (stored hashed)"
    ),
    data_dir: Path = typer.Option(
        Path("runs/service"), envvar="TSRL_DATA_DIR", help="SQLite file and run directories"
    ),
    launcher: str = typer.Option(
        "embedded", envvar="TSRL_LAUNCHER", help="embedded (subprocess) or ray (Ray jobs)"
    ),
    ray_address: str = typer.Option(None, envvar="TSRL_RAY_ADDRESS", help="Ray dashboard URL"),
    max_concurrent_runs: int = typer.Option(1, envvar="TSRL_MAX_CONCURRENT_RUNS", min=1),
    keep_runs_on_exit: bool = typer.Option(
        False, help="leave drivers running when the service stops (adopted on restart)"
    ),
) -> None:
    """Serve the REST API (/api/v1, docs at /docs) and the live dashboard (/)."""
    import uvicorn

    from service.main import create_app
    from service.settings import Settings

    if launcher not in ("embedded", "ray"):
        typer.echo(f"--launcher {launcher!r} unknown: use 'embedded' or 'ray'", err=True)
        raise typer.Exit(2)
    settings = Settings(
        host=host,
        port=port,
        data_dir=data_dir,
        database_url=database_url,
        admin_token=admin_token,
        launcher=launcher,
        ray_address=ray_address,
        max_concurrent_runs=max_concurrent_runs,
        stop_runs_on_exit=not keep_runs_on_exit,
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("uvicorn.access").addFilter(RedactTokens())
    typer.echo(
        f"ThunderSync service on http://{host}:{port}/ (database: {settings.db_url.split('://')[0]})"
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
