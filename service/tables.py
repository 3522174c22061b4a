"""Database tables: tokens, runs, the driver's per-update metrics and timeline spans, task sets.

Tokens are stored as SHA-256 digests only (the secret is shown once, at creation) and named by a
random public id, so no part of a secret is in the database. Every run and task set belongs to a
token; API reads filter on the owner, so another token's rows are invisible.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from thundersync.rundir import RunStatus
from thundersync.service.db import Base, UTCDateTime, utcnow
from thundersync.service.security import new_public_id

# Stored as the enum's values in a VARCHAR(20) (no CHECK constraint, no native enum type): the same
# column as before the enum, so no data migration; rows read back as RunStatus members.
RUN_STATUS_TYPE = Enum(
    RunStatus,
    name="run_status",
    native_enum=False,
    length=20,
    create_constraint=False,
    validate_strings=True,
    values_callable=lambda e: [m.value for m in e],
)

# Byte offsets into the run's JSONL files: 64-bit (SQLite's INTEGER already is).
OFFSET_TYPE = BigInteger().with_variant(Integer(), "sqlite")


class ArtifactOrigin(StrEnum):
    """Where an artifact's files are: a host path an admin registered, files uploaded into the
    service's data dir, or (task sets only) a dataset URI the service records but never reads."""

    HOST = "host"
    UPLOAD = "upload"
    URI = "uri"


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    public_id: Mapped[str] = mapped_column(
        String(12), unique=True, index=True, default=new_public_id
    )
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    # concurrent (queued / starting / running) runs this token may have; None: the service default
    max_active_runs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_owner_created", "owner_id", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    owner_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    recipe: Mapped[str | None] = mapped_column(String(200), nullable=True)
    objective: Mapped[str] = mapped_column(String(20))
    schedule: Mapped[str] = mapped_column(String(20))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[RunStatus] = mapped_column(RUN_STATUS_TYPE, default=RunStatus.QUEUED, index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    backend: Mapped[str] = mapped_column(String(20), default="embedded")
    run_dir: Mapped[str] = mapped_column(Text, default="")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    job_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    metrics_offset: Mapped[int] = mapped_column(OFFSET_TYPE, default=0)
    spans_offset: Mapped[int] = mapped_column(OFFSET_TYPE, default=0)
    updates_done: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    updates: Mapped[list[UpdateRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )
    spans: Mapped[list[SpanRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class UpdateRow(Base):
    """One line of DIR/metrics.jsonl: a finished optimizer update."""

    __tablename__ = "updates"
    __table_args__ = (UniqueConstraint("run_id", "update", name="uq_updates_run_update"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    update: Mapped[int] = mapped_column(Integer)
    schedule: Mapped[str] = mapped_column(String(20), default="")
    time: Mapped[float] = mapped_column(Float, default=0.0)
    step_s: Mapped[float] = mapped_column(Float, default=0.0)
    rollout_s: Mapped[float] = mapped_column(Float, default=0.0)
    learner_busy_s: Mapped[float] = mapped_column(Float, default=0.0)
    barrier_s: Mapped[float] = mapped_column(Float, default=0.0)
    idle_share: Mapped[float] = mapped_column(Float, default=0.0)
    mfu: Mapped[float] = mapped_column(Float, default=0.0)
    reward_mean: Mapped[float] = mapped_column(Float, default=0.0)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    run: Mapped[Run] = relationship(back_populates="updates")


class SpanRow(Base):
    """One line of DIR/spans.jsonl: a timeline interval on one lane."""

    __tablename__ = "spans"
    __table_args__ = (Index("ix_spans_run_start", "run_id", "start"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    update: Mapped[int] = mapped_column(Integer, default=0)
    role: Mapped[str] = mapped_column(String(20))
    kind: Mapped[str] = mapped_column(String(100), default="")
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    ready: Mapped[float | None] = mapped_column(Float, nullable=True)
    ids: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    run: Mapped[Run] = relationship(back_populates="spans")


class TaskSet(Base):
    """A registered collection of tasks (SWE-smith instances, SETA / Terminal-Bench tasks...).

    `origin` says where its tasks are (`ArtifactOrigin`): `source` for a host path (admins only),
    the service's data dir for uploads; `shared` (admins only) lets every token use it."""

    __tablename__ = "task_sets"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_task_sets_owner_name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    owner_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(40))
    source: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    task_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    origin: Mapped[str] = mapped_column(String(20), default=ArtifactOrigin.HOST.value)
    shared: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelArtifact(Base):
    """A model directory runs may start from (`model.path`) or distil from (`teacher.model`):
    a host path an admin registered (`path`), or files uploaded into the service's data dir."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_models_owner_name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    owner_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    origin: Mapped[str] = mapped_column(String(20))
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    description: Mapped[str] = mapped_column(Text, default="")
    shared: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RecipeArtifact(Base):
    """A recipe a token uploaded (its YAML text, validated as a run config at upload), used by
    name in `POST /runs {"recipe": NAME}` before the shipped recipes of that name space."""

    __tablename__ = "recipes"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_recipes_owner_name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    owner_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
