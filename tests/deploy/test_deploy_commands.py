"""Every command the deployment starts is a real `tsrl` command with real flags.

Collected from: each image's ENTRYPOINT + CMD, each compose service's entrypoint + command, each
Kubernetes container's command + args, the RayJob entrypoint, the Ray cluster launcher's start
commands, the entrypoint the service's Ray launcher submits (service/launcher/ray_backend.py) and
the commands of docs/deploy.md. A `tsrl ...` command must resolve to a registered (sub)command
whose `--help` exits 0, and every `--flag` it passes must be one of that command's options; a
`ray start` (compose, the cluster launcher, KubeRay's rayStartParams) likewise against ray's own
CLI. Other programs are allowed only from a short list (the database images' shells).
Commands still being written (PENDING) xfail until they are registered, then are checked fully.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from deploy_helpers import (
    DEPLOY,
    DOCKERFILES,
    IMAGES,
    K8S,
    ROOT,
    SANDBOX_IMAGES,
    compose,
    image_entry,
    image_repo,
    load_yaml_docs,
)
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.service.launcher.ray_backend import job_submission, ray_driver_command

# Not registered yet when deploy/ was written (the run driver and its benchmark are in progress).
PENDING = {("train",), ("bench", "speedup")}
# Programs other than tsrl that the deployment may start.
OTHER_PROGRAMS = {"sh", "/bin/bash", "redis-server"}


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "commands")  # typer may bring its own click: no isinstance(click.Group)


def _root() -> Any:
    cmd = typer.main.get_command(app)
    assert _is_group(cmd)
    return cmd


def resolve(argv: list[str]) -> tuple[tuple[str, ...], Any, list[str]]:
    """Walk `tsrl ARGV` down the command groups: (path, command or None, remaining args)."""
    node = _root()
    path: list[str] = []
    rest = list(argv)
    while _is_group(node) and rest and not rest[0].startswith("-"):
        sub = node.commands.get(rest[0])
        if sub is None:
            path.append(rest[0])
            return tuple(path), None, rest[1:]
        path.append(rest.pop(0))
        node = sub
    return tuple(path), node, rest


def collect() -> list[tuple[str, list[str]]]:
    """(where, argv) of every process the deployment starts."""
    found: list[tuple[str, list[str]]] = []
    for df in DOCKERFILES:
        entry, cmd = image_entry(df.name)
        found.append((f"image {df.name}", entry + cmd))
    services = compose()["services"]
    for name, svc in services.items():
        image = svc.get("image", "")
        df = IMAGES.get(image_repo(image))
        entry, cmd = image_entry(df) if df else ([], [])
        if "entrypoint" in svc:
            entry = (
                svc["entrypoint"]
                if isinstance(svc["entrypoint"], list)
                else shlex.split(svc["entrypoint"])
            )
            cmd = []
        if "command" in svc:
            cmd = (
                svc["command"] if isinstance(svc["command"], list) else shlex.split(svc["command"])
            )
        if df or entry or cmd:
            found.append((f"compose {name}", entry + cmd))
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            kind = doc.get("kind")
            if kind == "RayJob":
                found.append((f"k8s {path.name} RayJob", shlex.split(doc["spec"]["entrypoint"])))
            if kind == "RayCluster":  # KubeRay runs `ray start` with these as --key=value
                spec = doc["spec"]
                groups = [("head", spec["headGroupSpec"], ["--head"])] + [
                    (g["groupName"], g, []) for g in spec.get("workerGroupSpecs", [])
                ]
                for name, group, head in groups:
                    params = [f"--{k}={v}" for k, v in group.get("rayStartParams", {}).items()]
                    found.append(
                        (f"k8s {path.name} ray start {name}", ["ray", "start", *head, *params])
                    )
            for where, c in _containers(doc):
                if "command" not in c and "args" not in c:
                    continue  # image default (checked above) or KubeRay's own `ray start`
                df = IMAGES.get(image_repo(c["image"]))
                entry = c.get("command") or (image_entry(df)[0] if df else [])
                found.append(
                    (f"k8s {path.name} {kind} {where}", list(entry) + list(c.get("args", [])))
                )
    cluster = yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for line in cluster[key]:
            for part in re.split(r"\s*(?:;|&&)\s*", line):
                argv = shlex.split(part)
                if argv and argv[0] == "ray":
                    found.append((f"ray/cluster.yaml {key}", argv))
    # what the service's Ray launcher submits (its real command-building code)
    job = job_submission(
        ray_driver_command({}), "ID", Path("/data/runs/ID/config.json"), Path("/data/runs/ID")
    )
    found.append(("launcher ray job", launcher_argv(job["entrypoint"])))
    for i, argv in enumerate(doc_commands(ROOT / "docs" / "deploy.md")):
        found.append((f"docs/deploy.md command {i}", argv))
    return found


def launcher_argv(entrypoint: str) -> list[str]:
    """The driver's argv in the Ray launcher's `cd DIR && exec ARGV` entrypoint."""
    cd, sep, cmd = entrypoint.partition(" && exec ")
    assert sep and cd.startswith("cd "), entrypoint
    return shlex.split(cmd)


def doc_commands(path: Path) -> list[list[str]]:
    """`tsrl ...` / `ray start|job submit ...` lines of the doc's ```bash blocks (`--` starts the
    job's own argv: `ray job submit ... -- tsrl train ...` yields both, each checked)."""
    out: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            argv = shlex.split(line)
            if argv[0] == "tsrl":
                out.append(argv)
            # `ray ...` also behind `docker compose exec SERVICE` / `kubectl exec`
            at = next((i for i, w in enumerate(argv) if w == "ray"), None)
            if at is None:
                continue
            ray = argv[at:]
            if ray[:2] == ["ray", "start"]:
                out.append(ray)
            elif ray[:3] == ["ray", "job", "submit"] and "--" in ray:
                out.append(ray[: ray.index("--")])
                out.append(ray[ray.index("--") + 1 :])
    return out


def _containers(doc: dict) -> list[tuple[str, dict]]:
    spec = doc.get("spec") or {}
    templates = []
    if doc.get("kind") == "RayCluster":
        templates.append(spec["headGroupSpec"]["template"])
        templates += [g["template"] for g in spec.get("workerGroupSpecs", [])]
    elif "template" in spec:
        templates.append(spec["template"])
    out = []
    for t in templates:
        for c in t.get("spec", {}).get("containers", []):
            out.append((c["name"], c))
    return out


COMMANDS = collect()


def test_commands_were_collected() -> None:
    tsrl = [w for w, argv in COMMANDS if argv and argv[0].endswith("tsrl")]
    # 3 tsrl images, compose model-init + service, k8s model-init + service + RayJob, the Ray
    # launcher's job, docs/deploy.md (serve, ray job submit -- tsrl train)
    assert len(tsrl) >= 10, COMMANDS
    ray = [w for w, argv in COMMANDS if argv[:2] == ["ray", "start"]]
    # compose head + worker, KubeRay head + gpu-node, cluster launcher head + worker
    assert len(ray) >= 6, COMMANDS
    for df in DOCKERFILES:
        if df.name not in SANDBOX_IMAGES:
            assert image_entry(df.name)[0] == ["tsrl"], f"{df.name}: ENTRYPOINT must be tsrl"


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_is_real(where: str, argv: list[str]) -> None:
    assert argv, f"{where}: no command"
    prog = argv[0]
    if prog == "ray":
        _check_ray(where, argv[1:])
        return
    if not prog.endswith("tsrl"):
        assert prog in OTHER_PROGRAMS, f"{where}: {prog} is neither tsrl nor an allowed program"
        return
    path, cmd, rest = resolve(argv[1:])
    if cmd is None or _is_group(cmd):
        if path in PENDING or tuple(argv[1:3]) in PENDING or tuple(argv[1:2]) in PENDING:
            registered = sorted(_root().commands)
            pytest.xfail(f"{where}: `tsrl {' '.join(path)}` not registered yet ({registered})")
        pytest.fail(f"{where}: `tsrl {' '.join(argv[1:])}` is not a tsrl command")
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, f"{where}: tsrl {' '.join(path)} --help -> {result.output}"
    opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    flags = {a.split("=", 1)[0] for a in rest if a.startswith("--")}
    unknown = flags - opts
    assert not unknown, f"{where}: tsrl {' '.join(path)} has no option {sorted(unknown)}"


def _check_ray(where: str, args: list[str]) -> None:
    """`ray start|job submit ...` against ray's own click commands (ray is a dev dependency)."""
    from ray.scripts.scripts import cli

    node: Any = cli
    path: list[str] = []
    rest = list(args)
    while _is_group(node) and rest and not rest[0].startswith("-"):
        assert rest[0] in node.commands, f"{where}: `ray {' '.join([*path, rest[0]])}` unknown"
        path.append(rest.pop(0))
        node = node.commands[path[-1]]
    assert not _is_group(node), f"{where}: `ray {' '.join(path)}` is a group, not a command"
    opts = {o for p in node.params for o in (*p.opts, *p.secondary_opts)}
    flags = {a.split("=", 1)[0] for a in rest if a.startswith("--")}
    unknown = flags - opts
    assert not unknown, f"{where}: ray {' '.join(path)} has no option {sorted(unknown)}"
