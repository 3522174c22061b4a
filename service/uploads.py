"""Uploads into an artifact's folder in the service's data dir: `PUT .../files/PATH`, the raw bytes
as the body (any content type), streamed to disk and moved into place when complete.

The body limit of these routes is `Settings.max_upload_bytes` (service.limits); every other route
keeps `max_body_bytes`.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request, status

from thundersync.service.artifacts import ArtifactError, upload_target
from thundersync.service.errors import field_error
from thundersync.service.schemas import ErrorDetail
from thundersync.service.schemas_artifacts import UploadedFile

UPLOAD_PATHS = re.compile(r"^/api/v1/(models|task-sets)/[^/]+/files/")

UPLOAD_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "the file's bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
UPLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorDetail, "description": "not an upload artifact, or the path conflicts"},
}


async def save_upload(request: Request, root: Path, relpath: str, max_bytes: int) -> UploadedFile:
    """Write the request body to `root/relpath` (checked by `upload_target`); 413 past
    `max_bytes`, 409 when a file and a folder of the same name collide."""
    try:
        dest = upload_target(root, relpath)
    except ArtifactError as err:
        raise field_error(str(err), ["path", "file_path"]) from None
    tmp = root / f".upload-{uuid.uuid4().hex}.part"
    size = 0
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tmp.open("xb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise HTTPException(
                        status_code=status.HTTP_413_CONTENT_TOO_LARGE,
                        detail=f"upload too large: the limit is {max_bytes} bytes per file",
                    )
                f.write(chunk)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except OSError as err:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"path: {relpath[:80]!r} conflicts with an uploaded file or folder "
            f"({err.__class__.__name__}); delete the artifact and upload again",
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return UploadedFile(path=dest.relative_to(root).as_posix(), size=size)
