"""Bounded output capture: keep the head and the tail of a stream, count what was dropped.

A hostile command can print gigabytes; the executor must drain the pipe (or the command blocks)
without holding it. Agents mostly need the start (what ran) and the end (the error).
"""

from __future__ import annotations

import threading
from typing import IO

# `get_file` on both backends: regular files only (never a device, FIFO, socket, /proc or /sys
# file: a link to /dev/zero would stream forever), the link resolved inside the sandbox; a file
# over READ_MAX is refused before any byte moves (and `head` stops at READ_MAX + 1 if it grew)
READ_MAX = 256 * 1024 * 1024
READ_CHECK = (
    'p=$(readlink -f "$1") || exit 2; case "$p" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) '
    'exit 3;; esac; [ -f "$p" ] || exit 3; '
    f'[ "$(stat -c %s "$p")" -le {READ_MAX} ] || exit 4; '
)
READ_HEAD = f'head -c {READ_MAX + 1} -- "$p"'


class HeadTail:
    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            keep = self.cap - self.cap // 2
            if len(self.tail) > 2 * keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def drop_end(self, n: int) -> None:
        """Forget the last `n` bytes fed (an executor's own trailer, not the command's)."""
        self.total -= n
        cut = min(n, len(self.tail))
        del self.tail[len(self.tail) - cut :]
        if n - cut:
            del self.head[len(self.head) - (n - cut) :]

    def text(self) -> str:
        keep = self.cap - self.cap // 2
        tail = bytes(self.tail[-keep:]) if self.tail else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", "replace")
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... {dropped} bytes truncated ...]\n".encode()
        return (bytes(self.head) + marker + tail).decode("utf-8", "replace")


def drain(stream: IO[bytes], sink: HeadTail) -> threading.Thread:
    """Read `stream` to EOF into `sink` on a daemon thread."""

    def run() -> None:
        while True:
            chunk = stream.read(65536)
            if not chunk:
                break
            sink.feed(chunk)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t
