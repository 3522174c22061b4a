"""Terminal-Bench task directories: TB1 / SETA (task.yaml) and Harbor / TB2 (task.toml).

TB1 / SETA: task.yaml (instruction, max_agent_timeout_sec, max_test_timeout_sec), Dockerfile,
run-tests.sh (optional: Terminal-Bench's default runner is used without it), solution.sh,
tests/test_outputs.py, optional weights.json {test_name: weight} (SETA partial reward = passed
weight / total weight; a weight naming no test function of tests/ is an error; without weights
the reward is 1 only when every test passes). Harbor / TB2: task.toml ([agent] timeout_sec,
[verifier] timeout_sec, [environment] cpus, memory_mb or memory ("2G", "512M"), storage_mb (the
disk quota, default 1024), network: see below), instruction.md, environment/, solution/solve.sh
(optional: a task without it loads for training, its gold is not checked), tests/test.sh; the
reward is read from /logs/verifier/reward.txt, else reward.json (named scores; which one is
trained on: `terminal_reward`). Multi-step tasks ([[steps]]) and loading: `terminal_harbor`. SETA in the Harbor layout adds weights.json (checked as above): the reward is then
passed weight / total weight from the CTRF report tests/test.sh writes to /logs/verifier/ctrf.json.
Harbor network: [environment] network_mode "no-network" | "public" (the baseline; "allowlist" only
with no allowed_hosts, which denies all egress: the sandbox cannot limit egress to hosts), or the
older allow_internet (bool); [agent] / [verifier] network_mode override it for their phase. Both
unset: network off (Harbor's default is on; tasks here must run offline unless they ask).
The agent works in /app as the Dockerfile builds it: `app/` (TB1) or `environment/app/` (Harbor)
seeds it only when the Dockerfile copies it there (or there is no Dockerfile); on docker the
image's own /app is copied in (`terminal_steps.image_app`).
Images: on the docker backend the task's Dockerfile (TB1 / SETA: `Dockerfile` at the task root,
context the task root; Harbor: `environment/Dockerfile`, context environment/) is built once per
build context by `sandbox.images.ensure_image` (tag `tsrl-task-<name>:<hash12>`, nothing pulled)
and both the agent's and the verifier's sessions run in it. The local backend builds nothing:
tasks run on the sandbox base (python3, pytest, git) and the env's init metadata says so
(`sandbox.images.local_gap`: a Dockerfile that adds to the image then needs --backend docker).
The verifier runs in a session of its own after the agent's (`sandbox.envs.terminal_verify`):
tests are copied in only then; it runs as root (`SessionSpec.exec_user`), as TB1 and Harbor
runners expect, on the docker backend (the local backend keeps uid 65534); the agent never does.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from thundersync.sandbox.envs.terminal_task import (  # re-exported: the task's public names
    APP,
    NEEDS_NET,
    SCRATCH,
    Layout,
    Step,
    TaskError,
    TerminalTask,
    _need,
    _number,
    _weights,
    copies_app,
)

__all__ = [
    "APP",
    "SCRATCH",
    "Layout",
    "Step",
    "TaskError",
    "TerminalTask",
    "copies_app",
    "load_task",
]


def load_task(path: str | Path) -> TerminalTask:
    p = Path(path)
    if (p / "task.yaml").is_file():
        return _load_tb1(p)
    if (p / "task.toml").is_file():
        from thundersync.sandbox.envs.terminal_harbor import load_harbor

        return load_harbor(p)
    raise TaskError(
        f"{p}: not a task directory (expected task.yaml for TB1/SETA or task.toml for Harbor)"
    )


def _load_tb1(p: Path) -> TerminalTask:
    src = p / "task.yaml"
    try:
        meta = yaml.safe_load(src.read_text())
    except yaml.YAMLError as e:
        raise TaskError(f"{src}: not valid YAML ({e})") from None
    if not isinstance(meta, dict):
        raise TaskError(f"{src}: expected a mapping with an 'instruction' field")
    instruction = meta.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{src}: field 'instruction' must be a non-empty string")
    return TerminalTask(
        path=p,
        layout=Layout.TB1,
        instruction=instruction.strip(),
        agent_timeout=_number(src, meta, "max_agent_timeout_sec", 600),
        test_timeout=_number(src, meta, "max_test_timeout_sec", 120),
        verifier=p / "run-tests.sh" if (p / "run-tests.sh").is_file() else None,
        solution=_need(p / "solution.sh", "the oracle solution"),
        weights=_weights(p / "weights.json"),
        network_note=_tb1_network_note(p / "run-tests.sh"),
    )


def _tb1_network_note(runner: Path) -> str:
    """Terminal-Bench 1 runs its verifier with the network on; here it is always off."""
    if not runner.is_file() or not NEEDS_NET.search(runner.read_text()):
        return ""
    return (
        f"{runner}: installs or downloads, but the verifier runs without network here (the "
        "project's default; Terminal-Bench 1's is on): install what it needs in the Dockerfile"
    )
