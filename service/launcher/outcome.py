"""How a finished driver maps to a final run state and a reason a user can act on."""

from __future__ import annotations

from pathlib import Path

from thundersync.rundir import RunFiles, RunStatus

EXIT_CANCELLED = 3
# frames drawn around CLI errors (typer / rich): not part of the message
BOX_CHARS = " \t│┃╭╮╰╯─━|"


def last_output_line(run_dir: Path, limit: int = 300) -> str:
    try:
        with RunFiles(run_dir).output_log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        clean = line.strip(BOX_CHARS)
        if any(ch.isalnum() for ch in clean):
            return clean[:limit]
    return ""


def decide_outcome(
    run_dir: Path,
    exit_code: int | None,
    *,
    forced_after_cancel: bool = False,
    service_shutdown: bool = False,
    note: str = "",
) -> tuple[RunStatus, str]:
    """(status, reason). status.json wins; then the exit code (0 ok, 3 cancelled at a barrier)."""
    written = RunFiles(run_dir).read_status()
    if written is not None:
        status, reason = written
        return status, reason or f"driver reported {status}"
    if forced_after_cancel:
        return (
            RunStatus.CANCELLED,
            "driver did not stop at a barrier after the cancel request; it was killed",
        )
    if service_shutdown and exit_code != 0:
        return RunStatus.CANCELLED, "stopped because the service shut down; submit the run again"
    tail = last_output_line(run_dir)
    hint = f"; last output: {tail}" if tail else "; see the run's logs"
    if exit_code == 0:
        return RunStatus.SUCCEEDED, "driver exited 0"
    if exit_code == EXIT_CANCELLED:
        return RunStatus.CANCELLED, "driver stopped at a barrier after the cancel request (exit 3)"
    if exit_code is None:
        return RunStatus.FAILED, (note or "the driver is gone and left no status.json") + hint
    if exit_code < 0:
        return RunStatus.FAILED, f"driver killed by signal {-exit_code}{note}{hint}"
    return RunStatus.FAILED, f"driver exited with code {exit_code}{note}{hint}"
