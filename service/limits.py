"""Refuse oversized request bodies with 413 before they are read into memory.

Checks Content-Length up front and counts streamed (chunked) bodies as they arrive. Paths that
match `large_paths` (file uploads, streamed to disk) get `large_max_bytes` instead.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        large_paths: re.Pattern[str] | None = None,
        large_max_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.large_paths = large_paths
        self.large_max_bytes = large_max_bytes or max_bytes

    async def _reject(self, send: Send, limit: int) -> None:
        body = json.dumps(
            {
                "detail": f"request body too large: the limit is {limit} bytes; "
                "send a smaller config (large data belongs in an uploaded task set or model)"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if self.large_paths is not None and self.large_paths.match(scope.get("path", "")):
            limit = self.large_max_bytes
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > limit
            except ValueError:
                too_big = False
            if too_big:
                await self._reject(send, limit)
                return
        seen = 0
        started = False
        rejected = False

        async def limited_receive() -> Message:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit and not rejected:
                    if not started:
                        rejected = True
                        await self._reject(send, limit)
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if rejected:
                return  # the 413 is already out; drop whatever the app answers to the error
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, limited_receive, tracking_send)
