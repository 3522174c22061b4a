"""Shared paths and loaders for the deploy/ checks (tools come from scripts/setup.d/50-deploy.sh)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"
TOOLS = ROOT / ".venv-deploy" / "bin"
SETUP = "scripts/setup.d/50-deploy.sh"

DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
SANDBOX_IMAGES = {"sandbox-swesmith.Dockerfile", "sandbox-seta.Dockerfile"}
# image name in compose / k8s -> the Dockerfile that builds it
IMAGES = {
    "thundersync/service": "service.Dockerfile",
    "thundersync/learner": "learner.Dockerfile",
    "thundersync/engine": "engine.Dockerfile",
}


def tool(name: str) -> str:
    """A validator from .venv-deploy (or PATH); fails naming the setup script when missing."""
    p = TOOLS / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"{name} is not installed: run `sudo bash {SETUP}`")


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument text) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def exec_form(arg: str) -> list[str]:
    """ENTRYPOINT / CMD argument as a list (exec form JSON, else shell words)."""
    arg = arg.strip()
    if arg.startswith("["):
        return list(json.loads(arg))
    return shlex.split(arg)


def image_entry(dockerfile: str) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the final stage of a Dockerfile."""
    entry: list[str] = []
    cmd: list[str] = []
    for word, arg in dockerfile_instructions(DOCKER / dockerfile):
        if word == "FROM":
            entry, cmd = [], []
        elif word == "ENTRYPOINT":
            entry = exec_form(arg)
        elif word == "CMD":
            cmd = exec_form(arg)
    return entry, cmd


def image_repo(image: str) -> str:
    return re.sub(r"[:@].*$", "", image)
