"""One typed run config (pydantic), built from a recipe YAML plus overrides.

Every validation error names the field and says how to fix it; `load_run_config` turns pydantic's
error list into one `ConfigError` whose message is meant to be shown to the user as is.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from thundersync.config_base import INT64_MAX as INT64_MAX
from thundersync.config_base import INT64_MIN as INT64_MIN
from thundersync.config_base import _Section

# the env section and the built-in artefact names live in their own file; re-exported here
from thundersync.config_env import BUILTIN_MODELS as BUILTIN_MODELS
from thundersync.config_env import BUILTIN_TASK_SETS as BUILTIN_TASK_SETS
from thundersync.config_env import EnvConfig as EnvConfig
from thundersync.config_env import EnvName as EnvName
from thundersync.config_env import PromptExample as PromptExample

# the model, optimiser and learner sections live in their own file; re-exported here
from thundersync.config_learner import AccumDevice as AccumDevice
from thundersync.config_learner import Arch as Arch
from thundersync.config_learner import Checkpointing as Checkpointing
from thundersync.config_learner import Device as Device
from thundersync.config_learner import Estimator as Estimator
from thundersync.config_learner import GroupReduction as GroupReduction
from thundersync.config_learner import GrpoSum as GrpoSum
from thundersync.config_learner import LearnerConfig as LearnerConfig
from thundersync.config_learner import ModelConfig as ModelConfig
from thundersync.config_learner import OpdTurnGraphs as OpdTurnGraphs
from thundersync.config_learner import OptimConfig as OptimConfig

# the metrics export section (TensorBoard, W&B)
from thundersync.config_logging import LoggingConfig as LoggingConfig
from thundersync.config_logging import WandbMode as WandbMode

# the serving-side sections live in their own file; re-exported here, where callers look
from thundersync.config_serving import EngineSettings as EngineSettings
from thundersync.config_serving import FailurePolicy as FailurePolicy
from thundersync.config_serving import PlacementConfig as PlacementConfig
from thundersync.config_serving import PlacementPreset as PlacementPreset
from thundersync.config_serving import PlacementStrategy as PlacementStrategy
from thundersync.config_serving import PublishConfig as PublishConfig
from thundersync.config_serving import RolloutConfig as RolloutConfig
from thundersync.config_serving import RolloutEngine as RolloutEngine
from thundersync.config_serving import TeacherConfig as TeacherConfig
from thundersync.config_serving import TeacherScoring as TeacherScoring
from thundersync.config_serving import TeacherVLLMSettings as TeacherVLLMSettings
from thundersync.config_serving import VLLMDtype as VLLMDtype
from thundersync.config_serving import VLLMSettings as VLLMSettings
from thundersync.config_serving import WeightTransport as WeightTransport
from thundersync.config_serving import apply_preset

RECIPES_DIR = Path(__file__).parent / "recipes"  # package data (a link to ../recipes in a checkout)


class Objective(StrEnum):
    GRPO = "grpo"
    OPD = "opd"


class Schedule(StrEnum):
    SYNC = "sync"
    GROUP = "group"
    STREAM = "stream"
    ASYNC = "async"
    FULLY_ASYNC = "fully_async"


LOSSLESS_SCHEDULES = (Schedule.SYNC, Schedule.GROUP, Schedule.STREAM)


class RunConfig(_Section):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str = Field("run", max_length=200, description="run name (200 characters at most)")
    objective: Objective = Objective.GRPO
    schedule: Schedule = Schedule.STREAM
    updates: int = Field(10, ge=1, description="number of optimizer steps")
    seed: int = 0
    checkpoint_every: int = Field(0, ge=0, description="0 disables checkpoints")
    output_dir: str = "runs/default"
    record_batches: bool = Field(
        False,
        description="log every applied source and every version's weights, so that "
        "`tsrl replay-gap RUN_DIR` can check the run against sync from theta_0",
    )
    mfu_peak_flops: float | None = Field(
        None,
        gt=0,
        description="peak FLOP/s used for MFU; None: a GPU's datasheet dense bf16 peak, "
        "measured on CPU (thundersync/peak.py)",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @property
    def tiny_width(self) -> int:
        """The tiny model's width: vLLM's CPU attention needs a head size of 32 or more."""
        if self.model.tiny_hidden is not None:
            return self.model.tiny_hidden
        return 128 if self.rollout.engine is RolloutEngine.VLLM else 64

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, raw: Any) -> Any:
        return apply_preset(raw) if isinstance(raw, dict) else raw

    @model_validator(mode="after")
    def _cross(self) -> RunConfig:
        vllm = self.rollout.engine is RolloutEngine.VLLM
        if self.rollout.replicas > 1 and not vllm:
            raise ValueError(
                "rollout.replicas > 1 needs rollout.engine=vllm (the HF engine is one "
                "in-process replica): set rollout.engine=vllm or rollout.replicas=1"
            )
        if self.publish.transport is WeightTransport.BROADCAST and (
            not vllm or self.schedule not in LOSSLESS_SCHEDULES
        ):
            raise ValueError(
                "publish.transport=broadcast needs rollout.engine=vllm and a lossless schedule "
                "(sync, group, stream): every replica joins the broadcast as it loads; use "
                "publish.transport=shm otherwise"
            )
        if vllm and self.model.path is None and self.tiny_width < 128:
            raise ValueError(
                f"model.tiny_hidden={self.tiny_width} with rollout.engine=vllm: vLLM needs a "
                "head size >= 32, so set model.tiny_hidden to 128 or more (or leave it unset)"
            )
        if (
            self.objective is Objective.OPD
            and self.teacher.model is None
            and self.env.name != "toy"
        ):
            raise ValueError(
                "objective 'opd' needs teacher.model: set teacher.model to a model directory"
            )
        rloo = self.objective is Objective.GRPO and self.learner.estimator is Estimator.RLOO
        if rloo and self.rollout.group_size < 2:
            raise ValueError("estimator 'rloo' needs rollout.group_size >= 2: raise group_size")
        return self

    @model_validator(mode="after")
    def _teacher_context(self) -> RunConfig:
        n, need = self.teacher.vllm.max_model_len, self.rollout.max_total_tokens
        scored = self.objective is Objective.OPD and self.teacher.backend == "vllm"
        if scored and n is not None and n < need:
            raise ValueError(
                f"teacher.vllm.max_model_len={n} is smaller than rollout.max_total_tokens={need} "
                "(the teacher scores a trajectory's whole context): raise "
                f"teacher.vllm.max_model_len to {need} or more, leave it unset, or lower "
                "rollout.max_total_tokens"
            )
        return self


class ConfigError(ValueError):
    """A config problem phrased for the user: which field, what is wrong, how to fix it."""


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<config>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field: remove it or check the spelling (see `tsrl config schema`)"
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{key}: {p!r} is not a section, so it cannot hold {parts[-1]!r}")
        cur = nxt
    if isinstance(value, dict) and isinstance(cur.get(parts[-1]), dict):
        for k, v in value.items():
            _set_dotted(cur, f"{parts[-1]}.{k}", v)
    else:
        cur[parts[-1]] = value


def parse_set_overrides(items: list[str]) -> dict[str, Any]:
    """`--set key=value` items (every command's) -> dotted overrides.

    A value that parses as JSON (numbers, true/false/null, lists, objects, quoted strings) is
    taken as such; anything else is the plain string, so `env.name=terminal` needs no quotes.
    """
    import json

    out: dict[str, Any] = {}
    for kv in items:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {kv!r}: write key=value, e.g. --set updates=2")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def recipe_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    cand = RECIPES_DIR / f"{name_or_path}.yaml"
    if cand.exists():
        return cand
    known = sorted(x.stem for x in RECIPES_DIR.glob("*.yaml"))
    raise ConfigError(f"recipe {name_or_path!r} not found: use one of {known} or a .yaml path")


def _read_recipe(path: Path) -> Any:
    """A recipe file's YAML; a file that cannot be read or parsed is a ConfigError naming the file
    and, for bad YAML, the line and column (recipes/NAME.yaml for the shipped recipes)."""
    shown = path
    if path.is_relative_to(RECIPES_DIR):
        shown = Path(RECIPES_DIR.name) / path.relative_to(RECIPES_DIR)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"recipe {shown}: cannot read it ({err.__class__.__name__})") from None
    return parse_recipe_text(text, str(shown))


def parse_recipe_text(text: str, shown: str) -> Any:
    """A recipe's YAML; bad YAML is a ConfigError naming `shown` (the file or the upload), the
    line and the column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = "an unknown line"
        if mark is not None:
            where = f"line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"recipe {shown}: invalid YAML at {where}: {problem}; fix it") from None


def load_run_config(
    recipe: str | None = None,
    overrides: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> RunConfig:
    """Build a validated RunConfig from a recipe (name or path) and/or a dict, then overrides."""
    raw: dict[str, Any] = {}
    if recipe is not None:
        loaded = _read_recipe(recipe_path(recipe)) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"recipe {recipe!r}: top level must be a mapping of fields")
        raw = loaded
    for k, v in (data or {}).items():
        _set_dotted(raw, k, v)
    for k, v in (overrides or {}).items():
        _set_dotted(raw, k, v)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def load_config_arg(config: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    """`tsrl train CONFIG`: a recipe name, a recipe .yaml, or a resolved config .json."""
    import json

    p = Path(config)
    if p.suffix == ".json" and p.exists():
        return load_run_config(data=json.loads(p.read_text()), overrides=overrides)
    return load_run_config(config, overrides)


def revalidate(cfg: RunConfig) -> RunConfig:
    """Validate a config again as a whole. An assignment inside a section
    (`cfg.rollout.group_size = 1`) re-checks only that section, not the rules across sections
    (`_cross`), so whoever starts a run from a config object calls this first."""
    try:
        return RunConfig.model_validate(cfg.model_dump())
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
