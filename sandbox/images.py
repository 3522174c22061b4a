"""Task images: a terminal task's Dockerfile built through the docker SDK (docker backend only).

`ensure_image(client, task, context, dockerfile)` builds the image once per build context: the
tag is `tsrl-task-<name>:<hash12>`, the hash covering the Dockerfile and every file of the context
directory (path, mode, bytes; `__pycache__` / `.git` left out: they change without the task
changing), so an edited task gets a new tag (its older tags are pruned) and an unchanged one reuses
the existing tag without building. Nothing is pulled (`pull=False`; these machines have no registry): every base image
named by a `FROM` must already be local, else `ImageBuildError` names the task, the Dockerfile,
the missing image and the fix, before any build starts. The local backend builds nothing
(`local_gap` says when a Dockerfile adds what the sandbox base lacks).
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

from thundersync.sandbox.executor import SandboxError

TAG_PREFIX = "tsrl-task-"
LABEL = "thundersync.task"
_SKIP = {"__pycache__", ".git"}
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
builds = 0  # images actually built by this process (the tests count cache hits with it)


class ImageBuildError(SandboxError):
    """A task image that cannot be built; the message names the task, the file and the fix."""


def context_hash(context: Path, dockerfile: Path) -> str:
    """sha256 of the Dockerfile and every file under `context` (relative path, mode, bytes)."""
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile.read_bytes() + b"\0")
    for p in sorted(context.rglob("*")):
        if _SKIP & set(p.relative_to(context).parts):
            continue
        rel = str(p.relative_to(context)).encode()
        if p.is_symlink():
            h.update(b"L" + rel + b"\0" + str(p.readlink()).encode() + b"\0")
        elif p.is_file():
            h.update(b"F" + rel + b"\0" + oct(p.stat().st_mode & 0o777).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
        elif p.is_dir():
            h.update(b"D" + rel + b"\0")
    return h.hexdigest()


def image_tag(task: str, digest: str) -> str:
    """`tsrl-task-<name>:<hash12>`, the name lowered to what an image reference allows."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task.lower()).strip("._-") or "task"
    return f"{TAG_PREFIX}{name}:{digest[:12]}"


def _instructions(dockerfile: Path) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with comments dropped and `\\` continuations joined."""
    out: list[tuple[int, str, str]] = []
    buf, start = "", 0
    for n, line in enumerate(dockerfile.read_text().splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    if buf:
        word, _, rest = buf.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def base_images(dockerfile: Path) -> list[str]:
    """The images the `FROM` lines need (earlier stages and `scratch` excluded; `ARG` defaults
    given before the first FROM substituted)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False
    for _, word, rest in _instructions(dockerfile):
        if word == "ARG" and not seen_from:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip("\"'")
        elif word == "FROM":
            seen_from = True
            parts = [w for w in rest.split() if not w.startswith("--")]
            if not parts:
                continue
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2].lower())
            if image.lower() not in stages and image != "scratch" and image not in bases:
                bases.append(image)
    return bases


def _seed_copy(rest: str) -> bool:
    """COPY / ADD of the task's app/ seed into /app: the sessions copy the seed themselves."""
    parts = [w for w in rest.split() if not w.startswith("--")]
    return (
        len(parts) == 2
        and parts[0].rstrip("/") in ("app", ".")
        and parts[1].rstrip("/")
        in (
            "/app",
            ".",
        )
    )


def local_gap(dockerfile: Path | None) -> str | None:
    """Why the local backend (which builds nothing: sessions run on the sandbox base with the
    app/ seed) cannot reproduce this Dockerfile's image, or None when it adds nothing the task
    could depend on (only FROM / WORKDIR / ENV / LABEL / metadata and the app/ seed)."""
    if dockerfile is None or not dockerfile.is_file():
        return None
    for n, word, rest in _instructions(dockerfile):
        if word in ("RUN", "COPY", "ADD") and not (word != "RUN" and _seed_copy(rest)):
            return (
                f"{dockerfile}:{n}: `{word} {rest[:60]}` adds to the image; the local backend "
                "builds no Dockerfile: check this task with --backend docker"
            )
    return None


def _missing_base(client: Any, image: str) -> bool:
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return True
    return False


def ensure_image(client: Any, task: str, context: Path, dockerfile: Path) -> str:
    """The tag of `task`'s image, built from `dockerfile` in `context` unless that tag exists."""
    global builds
    import docker.errors

    tag = image_tag(task, context_hash(context, dockerfile))
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(tag, threading.Lock())
    with lock:  # envs of one task opening at once build it once
        if not _missing_base(client, tag):
            return tag
        for base in base_images(dockerfile):
            if _missing_base(client, base):
                raise ImageBuildError(
                    f"task {task!r}: {dockerfile}: base image {base!r} is not present locally "
                    "and nothing can be pulled here; pull it on a machine with a registry and "
                    f"load it (`podman pull {base}` + `podman save` / `podman load`), or retag a "
                    f"local image (`podman tag thundersync-sandbox:bookworm {base}`)"
                )
        try:
            client.images.build(
                path=str(context),
                dockerfile=str(dockerfile.relative_to(context)),
                tag=tag,
                pull=False,
                rm=True,
                forcerm=True,
                labels={LABEL: task},
            )
        except docker.errors.BuildError as e:
            log = "".join(str(c.get("stream") or c.get("error") or "") for c in e.build_log)
            raise ImageBuildError(
                f"task {task!r}: building {dockerfile} failed: {e.msg}; build log tail: "
                f"{log.strip()[-600:]}"
            ) from None
        except docker.errors.APIError as e:
            raise ImageBuildError(f"task {task!r}: building {dockerfile} failed: {e}") from None
        builds += 1
        prune_old_tags(client, tag)
        return tag


def prune_old_tags(client: Any, tag: str) -> list[str]:
    """Remove the task's images of earlier build contexts (`tsrl-task-<name>:<other hash>`), so
    an edited task does not leave one image per edit behind; one still used by a container
    stays (the engine refuses), as does every other tag of that image."""
    import docker.errors

    repo = tag.rsplit(":", 1)[0]
    removed = []
    for img in client.images.list(name=repo):
        for old in img.tags:
            name = old.removeprefix("localhost/").removeprefix("docker.io/library/")
            if name.rsplit(":", 1)[0] == repo and name != tag:
                try:
                    client.images.remove(old)
                    removed.append(name)
                except docker.errors.APIError:
                    pass
    return removed
