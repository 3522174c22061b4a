"""A run's log files read in chunks, the driver's captured output rendered as a terminal shows it.

output.log holds what the driver's libraries print for a terminal: tqdm bars redraw one line with
carriage returns hundreds of times and colour it with ANSI escapes, which read as noise when
shown raw. Rendered, each line keeps its last state (a carriage return moves to column 0 and the
next text overwrites), escapes are dropped, and a line still being redrawn (no newline yet) is
sent apart as `partial`, re-read from its start by the next chunk until it ends.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from thundersync.rundir import RunFiles
from thundersync.service.schemas import LogChunk

LogSource = Literal["log", "output"]
LOG_SOURCES = (
    "log: the per-update log (DIR/log.txt, with the driver's `stage:` lines); output: the "
    "driver's captured stdout/stderr, rendered as a terminal shows it"
)

# CSI (colours, cursor moves, erase), OSC (titles, links) and two-byte escapes
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")


def render_line(line: str) -> str:
    """One line's final state on a terminal: each carriage return overwrites from column 0."""
    cells: list[str] = []
    for seg in ANSI.sub("", line).split("\r"):
        cells[: len(seg)] = seg
    return "".join(cells).rstrip()


def render_terminal(data: bytes, *, at_eof: bool) -> tuple[str, int, str]:
    """(the complete lines rendered, bytes consumed, the unterminated last line rendered).

    Only complete lines are consumed, so a bar split across chunks is rendered whole later. A
    chunk without any newline that is not the file's end (a bar redrawn for longer than one
    chunk) is consumed up to its last carriage return: what came before it is overwritten. The
    API's default limit (64 KiB) holds any bar's single redraw whole.
    """
    end = data.rfind(b"\n") + 1
    done, rest = data[:end], data[end:]
    if end == 0 and not at_eof:
        end = rest.rfind(b"\r")
        if end > 0:
            rest = rest[end:]
        elif end == 0:  # one redraw longer than a chunk: skipped (its tail ends a later chunk)
            end = len(rest)
        else:  # one huge line without returns: show it as it is
            end, done, rest = len(rest), rest + b"\n", b""
    text = done.decode("utf-8", errors="replace")
    lines = [render_line(x) for x in text.split("\n")[:-1]]
    rendered = "".join(x + "\n" for x in lines)
    return rendered, end, render_line(rest.decode("utf-8", errors="replace"))


def read_log_chunk(path: Path, offset: int, limit: int, *, terminal: bool = False) -> LogChunk:
    """Up to `limit` bytes of `path` from `offset`; `terminal`: rendered as above."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            start = min(offset, size)
            f.seek(start)
            data = f.read(limit)
    except FileNotFoundError:
        return LogChunk(text="", offset=offset, next_offset=offset, size=0)
    if not terminal:
        text = data.decode("utf-8", errors="replace")
        return LogChunk(text=text, offset=start, next_offset=start + len(data), size=size)
    text, used, partial = render_terminal(data, at_eof=start + len(data) >= size)
    return LogChunk(text=text, offset=start, next_offset=start + used, size=size, partial=partial)


def read_run_log(files: RunFiles, source: LogSource, offset: int, limit: int) -> LogChunk:
    if source == "output":
        return read_log_chunk(files.output_log, offset, limit, terminal=True)
    return read_log_chunk(files.log, offset, limit)
