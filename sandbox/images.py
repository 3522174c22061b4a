"""Task images: a terminal task's Dockerfile built through the docker SDK (docker backend only).

`ensure_image(client, task, context, dockerfile)` builds the image once per build context: the
tag is `tsrl-task-<name>:<hash12>`, the hash covering the Dockerfile and every file of the context
directory (path, mode, bytes; `__pycache__` / `.git` left out: they change without the task
changing), so an edited task gets a new tag (its older tags are pruned) and an unchanged one reuses
the existing tag without building. Nothing is pulled (`pull=False`; these machines have no registry): every base image
named by a `FROM` must already be local, else `ImageBuildError` names the task, the Dockerfile,
the missing image and the fix, before any build starts. The local backend builds nothing
(`local_gap` says when a Dockerfile adds what the sandbox base lacks).
Published images (a `FROM` base, a SWE-smith `image_name`) that are not local go through the
image map (`env.image_map`, `tsrl env check --image-map`; `configure` sets it for the process):
a mapped image is tagged with the published name on the local image it maps to (so `FROM` and
`image_name` resolve offline; a task image built on a mapped base gets a tag of its own), an
unmapped one is pulled only with `env.image_pull`; otherwise `ImageBuildError` names the image,
the map option and the fix (`ensure_present`).
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
IMAGE_MAP: dict[str, str] = {}  # published -> local (`configure`: the run's env.image_map)
PULL = False  # pull unmapped missing images (env.image_pull)
MAP_HELP = (
    "env.image_map (run config; `tsrl env check --image-map PUBLISHED=LOCAL`) maps it to a local "
    "image; env.image_pull=true pulls it where a registry is reachable"
)


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


def configure(image_map: dict[str, str] | None = None, pull: bool = False) -> None:
    """This process's image map and pull policy (the run's `env.image_map` / `env.image_pull`)."""
    global PULL
    IMAGE_MAP.clear()
    IMAGE_MAP.update(image_map or {})
    PULL = pull


def mapped(image: str, image_map: dict[str, str] | None = None) -> str | None:
    """The local image `image` maps to: an exact key first, then the longest `prefix*` key (a
    value ending in '*' gets the rest of the name); None when no key matches."""
    table = IMAGE_MAP if image_map is None else image_map
    if image in table:
        return table[image]
    prefixes = [k for k in table if k.endswith("*") and image.startswith(k[:-1])]
    if not prefixes:
        return None
    key = max(prefixes, key=len)
    value = table[key]
    return value[:-1] + image[len(key) - 1 :] if value.endswith("*") else value


def _split_ref(image: str) -> tuple[str, str]:
    """repository, tag (`latest` when none; a `@digest` reference keeps its digest)."""
    if "@" in image:
        return image.split("@", 1)[0], ""
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:  # a registry port, not a tag
        return image, "latest"
    return repo, tag


def ensure_present(
    client: Any,
    image: str,
    what: str,
    *,
    image_map: dict[str, str] | None = None,
    pull: bool | None = None,
    apply: bool = True,
) -> str | None:
    """Make `image` resolvable locally by its own name (`what` names it in errors, e.g.
    "task 'x': <Dockerfile>: base image"); returns the local image it was mapped to, or None. A mapped image is tagged onto
    its target (with `apply`; the target must be local); an unmapped missing one is pulled when
    `pull` (with `apply`; without, the pull is left to the run). `ImageBuildError` otherwise."""
    import docker.errors

    pull = PULL if pull is None else pull
    target = mapped(image, image_map)
    if target is not None:
        if _missing_base(client, target):
            raise ImageBuildError(
                f"{what} {image!r} is mapped to {target!r} by env.image_map, which is "
                f"not present locally either: build or load {target!r} (`podman load`), or "
                "change the map entry"
            )
        if apply:
            repo, tag = _split_ref(image)
            client.images.get(target).tag(repo, tag or "latest")
        return target
    if not _missing_base(client, image):
        return None
    if pull and apply:
        repo, tag = _split_ref(image)
        try:
            client.images.pull(repo, tag=tag or None)
            return None
        except docker.errors.APIError as e:
            raise ImageBuildError(
                f"{what} {image!r} is not present locally and pulling it failed "
                f"({str(e)[:300]}); {MAP_HELP}, or load it (`podman load`)"
            ) from None
    if pull:
        return None  # pulled when the run starts
    raise ImageBuildError(
        f"{what} {image!r} is not present locally and nothing is pulled (env.image_pull "
        f"is off); {MAP_HELP}; or pull it on a machine with a registry and load it (`podman pull "
        f"{image}` + `podman save` / `podman load`), or retag a local image (`podman tag "
        f"thundersync-sandbox:bookworm {image}`)"
    )


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

    digest = context_hash(context, dockerfile)
    bases = base_images(dockerfile)
    via_map = sorted((b, m) for b in bases if (m := mapped(b)) is not None)
    if via_map:  # a changed map must not reuse an image built on another base
        ids = [(b, m, client.images.get(m).id) for b, m in via_map if not _missing_base(client, m)]
        digest = hashlib.sha256(f"{digest}\0{ids}".encode()).hexdigest()
    tag = image_tag(task, digest)
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(tag, threading.Lock())
    with lock:  # envs of one task opening at once build it once
        if not _missing_base(client, tag):
            return tag
        for base in bases:
            ensure_present(client, base, f"task {task!r}: {dockerfile}: base image")
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
