"""Print deploy/docker/requirements.lock: the runtime dependency closure of `thundersync` (no
extras) pinned to the versions installed in the running venv (the tested ones), plus Ray.

    .venv/bin/python deploy/docker/lock.py > deploy/docker/requirements.lock

Local version labels are dropped (`torch==2.13.0+cpu` -> `torch==2.13.0`) so one lock serves the
CPU and the CUDA images; each Dockerfile installs torch from its own index first.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

RAY = "ray[default]==2.60.0"


def closure(root: str = "thundersync") -> dict[str, str]:
    pins: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [Requirement(r) for r in distribution(root).requires or []]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            continue
        pins[key[0]] = dist.version.split("+")[0]
        for spec in dist.requires or []:
            sub = Requirement(spec)
            extras = ["", *sorted(req.extras)]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                sub.marker = None
                todo.append(sub)
    return pins


def main() -> None:
    print("# Runtime pins of the thundersync package (no extras): the tested versions of the venv.")
    print("# Regenerate: .venv/bin/python deploy/docker/lock.py > deploy/docker/requirements.lock")
    print("# torch is installed first from the CPU or CUDA index (see the Dockerfiles).")
    for name, version in sorted(closure().items()):
        print(f"{name}=={version}")
    print(RAY)


if __name__ == "__main__":
    main()
