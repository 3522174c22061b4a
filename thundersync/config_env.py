"""The env section of the run config (`RunConfig.env`) and the built-in artefact names a config
may use instead of paths (re-exported by `thundersync.config`).

Built in, so a run config (and the service, which refuses host paths) can name them:
`model.path: smollm2` / `teacher.model: smollm2` (SmolLM2-135M-Instruct, built once into the
artefact cache by `thundersync.smollm2`), `env.tasks: terminal-easy` (the shipped one-command terminal
tasks under sandbox/fixtures/terminal-easy).
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, model_validator

from thundersync.config_base import _Section

BUILTIN_MODELS = frozenset({"smollm2"})
_IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}\*?")


class EnvName(StrEnum):
    """`env.name`: which task catalogue entry a run trains on (see `sandbox.envs.catalogue`).

    Also accepted, and resolved to the canonical name: digits (toy), swesmith (swe-smith),
    seta and harbor (terminal).
    """

    TOY = "toy"
    SWE_SMITH = "swe-smith"
    TERMINAL = "terminal"
    SKYRL_DATASET = "skyrl-dataset"  # env.tasks: a SkyRL dataset file; rows name their env_class

    @classmethod
    def _missing_(cls, value: object) -> EnvName | None:
        return _ENV_ALIASES.get(value) if isinstance(value, str) else None


_ENV_ALIASES = {
    "digits": EnvName.TOY,
    "swesmith": EnvName.SWE_SMITH,
    "seta": EnvName.TERMINAL,
    "harbor": EnvName.TERMINAL,
}

# built-in task set name -> the env that reads it (its directory: sandbox.envs.fixtures)
BUILTIN_TASK_SETS: dict[str, EnvName] = {"terminal-easy": EnvName.TERMINAL}


class PromptExample(_Section):
    """One worked example shown before the task as a user turn and the assistant's reply."""

    user: str = Field(..., min_length=1, description="an example task, as the user turn")
    assistant: str = Field(..., min_length=1, description="its reply, e.g. a <tool> call")


class SandboxBackend(StrEnum):
    """Where tool calls run (thundersync.sandbox.backends.get_executor)."""

    LOCAL = "local"
    DOCKER = "docker"


class EnvConfig(_Section):
    name: EnvName = Field(
        EnvName.TOY,
        description="toy | swe-smith | terminal | skyrl-dataset (aliases: digits, swesmith, "
        "seta, harbor)",
    )
    tasks: str | None = Field(
        None, description="task set: a path, or built in: " + ", ".join(BUILTIN_TASK_SETS)
    )
    sandbox: SandboxBackend = Field(
        SandboxBackend.LOCAL, description="tool executor: local (bubblewrap) | docker"
    )
    tool_seconds: float = Field(0.0, ge=0, description="toy env: sandbox tool-call duration")
    examples: list[PromptExample] = Field(
        default_factory=list,
        max_length=8,
        description="terminal env: worked examples (user task + assistant reply) put between "
        "the system prompt and the task, so a small model sees the tool format used once",
    )
    image_map: dict[str, str] = Field(
        default_factory=dict,
        max_length=256,
        description="docker backend: published image -> local image, used when the published "
        "one (a Dockerfile's FROM, a SWE-smith image_name) is not on this machine; a key ending "
        "in '*' matches by prefix and a value ending in '*' gets the rest, e.g. "
        "{'ghcr.io/laude-institute/t-bench/*': 'localhost/t-bench/*'} (sandbox.images)",
    )
    reward_key: str | None = Field(
        None,
        description="terminal env: the reward.json key trained on (overrides task.toml "
        "[verifier] reward_key); a task whose reward.json lacks it earns 0 with the reason. "
        "Every named score is a metric either way (metrics.jsonl score/<name>)",
    )
    dataset_confined: bool = Field(
        False,
        description="skyrl-dataset: a row's file columns (task, instances_path, repos_dir) must "
        "be relative and stay inside the dataset file's folder (the service always sets it)",
    )
    image_pull: bool = Field(
        False,
        description="docker backend: pull a published image that is neither local nor mapped "
        "(where a registry is reachable); off: such a task is refused before the run starts",
    )

    @model_validator(mode="after")
    def _fits_env(self) -> EnvConfig:
        if self.name is EnvName.SKYRL_DATASET and not self.tasks:
            raise ValueError(
                "env.tasks is not set: env.name=skyrl-dataset reads a SkyRL dataset file "
                "(.parquet, .json or .jsonl; rows: prompt, env_class, extras): give its path "
                "(the service: a skyrl-gym task set)"
            )
        wanted = BUILTIN_TASK_SETS.get(self.tasks or "")
        if wanted is not None and wanted is not self.name:
            raise ValueError(
                f"env.tasks {self.tasks!r} is a built-in {wanted.value} task set, but env.name "
                f"is {self.name.value}: set env.name={wanted.value} or pick another task set"
            )
        for key, value in self.image_map.items():
            bad = next((s for s in (key, value) if not _IMAGE_REF.fullmatch(s)), None)
            if bad is not None or (value.endswith("*") and not key.endswith("*")):
                raise ValueError(
                    f"env.image_map: {key!r}: {value!r} is not published image -> local image "
                    "(image references without spaces; a '*' only at the end, and in the value "
                    "only when the key has one), e.g. {'swesmith.x86_64.*': 'localhost/swe/*'}"
                )
        if self.reward_key is not None and not self.reward_key.strip():
            raise ValueError(
                "env.reward_key is empty: give a reward.json key (e.g. 'correct') or remove "
                "env.reward_key (the task's [verifier] reward_key is used then)"
            )
        if self.reward_key is not None and self.name is not EnvName.TERMINAL:
            raise ValueError(
                f"env.reward_key: only env.name=terminal reads it (env.name is "
                f"{self.name.value}); remove env.reward_key"
            )
        if self.examples and self.name is not EnvName.TERMINAL:
            raise ValueError(
                f"env.examples: only env.name=terminal reads them (env.name is "
                f"{self.name.value}); remove env.examples"
            )
        return self
