"""Artifacts instead of host paths: what a submitted run config may name.

The service runs only models and task sets it knows: built in (`model.path` unset: the tiny model;
`model.path` / `teacher.model: smollm2`; `env.tasks` unset: the shipped fixtures, or
`terminal-easy`), registered by an admin (a host path, given explicitly), or uploaded into the
service's data dir. A config names them by name or id; a name resolves to the token's own
artifact, else to one an admin shared. The resolved config (what the driver reads) holds the
artifacts' paths; such a path given back (a config copied from GET /runs/{id}) is accepted when
it is exactly the path of an artifact the token may use. Any other path is refused without being
looked at: no stat, no read, no listing.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from thundersync.config import BUILTIN_MODELS, BUILTIN_TASK_SETS, EnvName, RunConfig
from thundersync.service.schemas_artifacts import ARTIFACT_NAME
from thundersync.service.settings import Settings
from thundersync.service.tables import ArtifactOrigin, ModelArtifact, TaskSet, Token

URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
NAME = re.compile(ARTIFACT_NAME)
BUILTIN_TEACHERS = (
    BUILTIN_MODELS  # names, never paths: the driver builds them (thundersync.config_env)
)
# which task-set kinds each env reads (its catalogue entry: sandbox/envs/catalogue.py)
ENV_KINDS: dict[EnvName, frozenset[str]] = {
    EnvName.TOY: frozenset(),
    EnvName.SWE_SMITH: frozenset({"swe-smith"}),
    EnvName.TERMINAL: frozenset({"seta", "terminal-bench", "harbor"}),
    EnvName.SKYRL_DATASET: frozenset({"skyrl-gym"}),
}
SAFE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
MAX_UPLOAD_DEPTH = 8


class ArtifactError(ValueError):
    """A field names something the token may not use: `field` is the dotted field, the message
    says why and what to give instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def is_uri(value: str) -> bool:
    return bool(URI.match(value)) and not value.lower().startswith("file://")


def models_root(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "artifacts" / "models"


def task_sets_root(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "artifacts" / "task-sets"


def model_files_dir(settings: Settings, row: ModelArtifact) -> Path:
    return models_root(settings) / str(row.id)


def task_set_files_dir(settings: Settings, row: TaskSet) -> Path:
    return task_sets_root(settings) / str(row.id)


def model_local_path(settings: Settings, row: ModelArtifact) -> str:
    if row.origin == ArtifactOrigin.HOST and row.path:
        return row.path
    return str(model_files_dir(settings, row))


def task_set_local_path(settings: Settings, row: TaskSet) -> str | None:
    """Where the driver reads the set: the registered host path, the upload dir (for a SWE-smith
    set, the first .jsonl file in it), or None (a URI: nothing local to read)."""
    if row.origin == ArtifactOrigin.HOST:
        return row.source
    if row.origin != ArtifactOrigin.UPLOAD:
        return None
    folder = task_set_files_dir(settings, row)
    if row.kind in ("swe-smith", "skyrl-gym"):  # the set is its (first) dataset file
        suffixes = (".jsonl",) if row.kind == "swe-smith" else (".jsonl", ".json", ".parquet")
        found = (
            sorted(p for p in folder.iterdir() if p.suffix in suffixes) if folder.is_dir() else []
        )
        return str(found[0]) if found else None
    return str(folder)


def visible(cls: type[ModelArtifact] | type[TaskSet], token: Token) -> Any:
    """Rows of `cls` the token may use: its own and the shared ones."""
    return select(cls).where(or_(cls.owner_id == token.id, cls.shared.is_(True)))


def _by_ref(session: Session, cls: Any, token: Token, ref: str) -> Any:
    """An artifact by id or name (own first, then shared), or None."""
    try:
        artifact_id = uuid.UUID(ref)
    except ValueError:
        rows = session.scalars(visible(cls, token).where(cls.name == ref)).all()
        rows = sorted(rows, key=lambda r: r.owner_id != token.id)
        return rows[0] if rows else None
    return session.scalar(visible(cls, token).where(cls.id == artifact_id))


def _uploaded_id(value: str, root: Path) -> uuid.UUID | None:
    """The artifact id of a path inside the service's upload area, read off the string only."""
    prefix = str(root) + "/"
    if not value.startswith(prefix):
        return None
    try:
        return uuid.UUID(value[len(prefix) :].split("/", 1)[0])
    except ValueError:
        return None


def _path_error(field: str, value: str, what: str, listing: str) -> ArtifactError:
    shown = value if len(value) <= 80 else value[:77] + "..."
    return ArtifactError(
        field,
        f"{shown!r} is a path; the service does not read host paths from a run config. Give the "
        f"name or id of a {what} this token may use ({listing}), upload one, or ask an admin to "
        "register it",
    )


def resolve_model(
    session: Session, settings: Settings, token: Token, field: str, value: str
) -> str:
    listing = "GET /api/v1/models"
    if NAME.fullmatch(value) or _is_uuid(value):
        row = _by_ref(session, ModelArtifact, token, value)
        if row is None:
            raise ArtifactError(
                field,
                f"no model {value!r} for this token (another token's models are not visible): "
                f"{listing} lists the ones you may use; POST /api/v1/models adds one",
            )
        return model_local_path(settings, row)
    rows = list(
        session.scalars(
            visible(ModelArtifact, token).where(
                ModelArtifact.origin == ArtifactOrigin.HOST, ModelArtifact.path == value
            )
        )
    )
    uploaded = _uploaded_id(value, models_root(settings))
    if uploaded is not None:
        rows += session.scalars(visible(ModelArtifact, token).where(ModelArtifact.id == uploaded))
    if any(model_local_path(settings, r) == value for r in rows):
        return value
    raise _path_error(field, value, "model", listing)


def resolve_task_set(
    session: Session, settings: Settings, token: Token, env: EnvName, value: str
) -> str:
    field, listing = "env.tasks", "GET /api/v1/task-sets"
    if NAME.fullmatch(value) or _is_uuid(value):
        row = _by_ref(session, TaskSet, token, value)
        if row is None:
            raise ArtifactError(
                field,
                f"no task set {value!r} for this token (another token's task sets are not "
                f"visible): {listing} lists the ones you may use",
            )
    else:
        rows = list(
            session.scalars(
                visible(TaskSet, token).where(
                    TaskSet.origin == ArtifactOrigin.HOST, TaskSet.source == value
                )
            )
        )
        uploaded = _uploaded_id(value, task_sets_root(settings))
        if uploaded is not None:
            rows += session.scalars(visible(TaskSet, token).where(TaskSet.id == uploaded))
        matches = [r for r in rows if task_set_local_path(settings, r) == value]
        if not matches:
            raise _path_error(field, value, "task set", listing)
        row = matches[0]
    kinds = ENV_KINDS[env]
    if row.kind not in kinds:
        wanted = ", ".join(sorted(kinds)) or "none: it has its own tasks (remove env.tasks)"
        raise ArtifactError(
            field, f"task set {row.name!r} is a {row.kind} set; env.name {env.value} reads {wanted}"
        )
    local = task_set_local_path(settings, row)
    if local is None:
        why = (
            "its source is a dataset URI the driver cannot read"
            if row.origin == ArtifactOrigin.URI
            else "no tasks are uploaded yet (a SWE-smith set needs a .jsonl file, a skyrl-gym "
            "set a .jsonl, .json or .parquet dataset file)"
        )
        raise ArtifactError(
            field, f"task set {row.name!r} has nothing to run: {why}; upload its tasks"
        )
    return local


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def resolve_run_artifacts(
    session: Session, settings: Settings, token: Token, cfg: RunConfig
) -> RunConfig:
    """The config with `model.path`, `teacher.model` and `env.tasks` resolved to the paths of
    artifacts the token may use; ArtifactError (naming the field) for anything else, and for
    `rollout.vllm.urls` from a token that is not an admin's (URLs the service would call)."""
    model, teacher, env = cfg.model, cfg.teacher, cfg.env
    if env.name is EnvName.SKYRL_DATASET:
        # its rows name task directories: only paths inside the task set's own folder
        env = env.model_copy(update={"dataset_confined": True})
    if cfg.rollout.vllm.urls and not token.is_admin:
        # the driver would call those URLs from the service's host (and load weights into them)
        raise ArtifactError(
            "rollout.vllm.urls",
            "only an admin token may attach a run to running vLLM servers; leave it unset "
            "(the run starts its own replicas)",
        )
    if model.path is not None and model.path not in BUILTIN_MODELS:
        model = model.model_copy(
            update={"path": resolve_model(session, settings, token, "model.path", model.path)}
        )
    if teacher.model is not None and teacher.model not in BUILTIN_TEACHERS:
        path = resolve_model(session, settings, token, "teacher.model", teacher.model)
        teacher = teacher.model_copy(update={"model": path})
    # a built-in set stays a name (the config already checked it fits env.name)
    if env.tasks is not None and env.tasks not in BUILTIN_TASK_SETS:
        path = resolve_task_set(session, settings, token, EnvName(env.name), env.tasks)
        env = env.model_copy(update={"tasks": path})
    return cfg.model_copy(update={"model": model, "teacher": teacher, "env": env})


def upload_target(root: Path, relpath: str) -> Path:
    """`root / relpath` for an upload, checked on the string only: relative, at most
    MAX_UPLOAD_DEPTH parts, each made of letters, digits, `_`, `-` and `.` (not first)."""
    parts = relpath.split("/")
    if not (len(parts) <= MAX_UPLOAD_DEPTH and all(SAFE_PART.fullmatch(p) for p in parts)):
        raise ArtifactError(
            "path",
            f"{relpath[:80]!r} is not a file path inside the artifact: use up to "
            f"{MAX_UPLOAD_DEPTH} parts of letters, digits, '_', '-', '.' (not first), e.g. "
            "config.json or task-1/task.yaml",
        )
    return root.joinpath(*parts)
