"""A run's parts, built from its config: models, teacher, rollout engine, chat format, loop config.

Which model: `model.path` (a directory, or built in: `smollm2` from the artefact cache), or a tiny
model built into the run directory (OPD: a tiny teacher too, or SmolLM2-135M whose tokenizer the
tiny student then shares). Which teacher: in-process HF (embedded default), a Ray actor (with
`--ray`), or a supervised vLLM server. Which engine: the in-process HF engine, one in a Ray
actor, or vLLM replicas (driver/vllm_replicas.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from thundersync.config import BUILTIN_MODELS, Objective, RolloutEngine, RunConfig, TeacherScoring
from thundersync.driver.vllm_replicas import vllm_replicas
from thundersync.rollout.agent_loop import AgentLoopConfig
from thundersync.rollout.chat import TokenizerChatFormat
from thundersync.rollout.inference_engine import InferenceEngine
from thundersync.rollout.replicas import ReplicaSet
from thundersync.rollout.types import SamplingParams
from thundersync.rundir import RunFiles

if TYPE_CHECKING:
    import torch

    from thundersync.cluster.local_plan import LocalPlan
    from thundersync.cluster.ray_plan import PlacementRole
    from thundersync.cluster.ray_servers import ServerGroup
    from thundersync.rollout.vllm_server import VLLMServer
    from thundersync.teacher.client import TeacherClient
    from thundersync.teacher.scorer import Scorer


class ConfigUnsupported(ValueError):
    """A config value this build cannot run (named with the fix)."""


def build_models(cfg: RunConfig, files: RunFiles) -> tuple[Path, Path | None]:
    """(the student's directory, the teacher's or None), built into the run dir when needed."""
    from thundersync.hf_models import build_tiny_model, load_tokenizer

    m = cfg.model
    if m.path in BUILTIN_MODELS:  # smollm2: built once into the artefact cache, read only
        from thundersync.smollm2 import smollm2_dir

        student = smollm2_dir()
    else:
        student = Path(m.path) if m.path else files.model

    def tiny(out: Path, seed: int, **kw: Any) -> None:
        if not (out / "config.json").exists():
            build_tiny_model(out, seed=seed, layers=m.tiny_layers, arch=m.tiny_arch, **kw)

    if cfg.objective is Objective.OPD and cfg.teacher.model == "smollm2":
        # the real 135M teacher; the tiny student shares its tokenizer (OPD needs one vocabulary)
        from thundersync.smollm2 import build_smollm2

        if not (files.teacher / "config.json").exists():
            build_smollm2(files.teacher)
        marker = files.model / ".from-teacher"
        if not m.path and not marker.exists():
            tok = load_tokenizer(files.teacher)
            build_tiny_model(
                student,
                seed=m.tiny_seed,
                layers=m.tiny_layers,
                hidden=cfg.tiny_width,
                tokenizer=tok,
                arch=m.tiny_arch,
            )
            marker.write_text("")
        return student, files.teacher
    if not m.path:
        tiny(student, m.tiny_seed, hidden=cfg.tiny_width)
    if cfg.objective is not Objective.OPD:
        return student, None
    if cfg.teacher.model:
        return student, Path(cfg.teacher.model)
    hidden = 128 if cfg.teacher.backend == "vllm" else 64  # vLLM needs head size >= 32
    tiny(files.teacher, m.tiny_seed + 1, tokenizer=load_tokenizer(student), hidden=hidden)
    return student, files.teacher


class PolicyLoad(TypedDict):
    """How the rollout replicas loaded one published version (merged into its metrics line)."""

    acked_by: tuple[str, ...]
    load_method: str
    load_s: float


@dataclass
class RolloutParts:
    """What the driver's process runs rollouts with: the inference engine, the chat format, the
    agent loop's settings, the teacher (OPD), and what the run learns of them as it goes."""

    engine: InferenceEngine
    chat: TokenizerChatFormat
    loop_cfg: AgentLoopConfig
    teacher: TeacherClient | None = None
    teacher_server: VLLMServer | ServerGroup | None = None  # a supervised teacher server
    on_ray: bool = False
    loads: dict[int, PolicyLoad] = field(default_factory=dict)  # version -> who loaded it, how
    notes: list[str] = field(default_factory=list)  # log lines on how the parts were set up

    def report(self) -> list[str]:
        """Log lines on what the rollout parts did: per-replica trajectories, the teacher's
        scoring counters. A report only: a dead teacher actor must not mask the run's error."""
        lines = list(self.notes)
        if isinstance(self.engine, ReplicaSet):
            lines.append(
                f"rollout on {len(self.engine.engines)} vLLM replicas; "
                f"trajectories per replica: {self.engine.routed}"
            )
        if self.teacher is not None:
            import json

            from thundersync.teacher.incremental import scorer_stats

            try:
                stats = scorer_stats(self.teacher.scorer)
            except Exception as e:  # noqa: BLE001
                stats = {"error": repr(e)}
            if stats is not None:
                lines.append(f"teacher: {json.dumps(stats)}")
        return lines

    def close(self) -> None:
        if isinstance(self.engine, ReplicaSet) or self.on_ray:
            self.engine.close()  # stops the vLLM servers (not attached ones) / the engine actor
        if self.teacher is not None:
            self.teacher.close()
        if self.teacher_server is not None:
            self.teacher_server.stop()
        if self.on_ray:
            from thundersync.cluster.ray_actors import reset_sandbox_workers

            reset_sandbox_workers()

    def kill_teacher(self) -> None:
        """SIGKILL the teacher server's whole process group (fault injection)."""
        import os
        import signal

        proc = self.teacher_server.proc if self.teacher_server is not None else None
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _scorer(
    cfg: RunConfig, teacher_dir: Path, files: RunFiles, on_ray: bool, gpus: LocalPlan | None
) -> tuple[Scorer, VLLMServer | ServerGroup | None]:
    """(the frozen teacher's scorer, its supervised server or None)."""
    from thundersync.cluster.ray_plan import PlacementRole

    backend = cfg.teacher.backend
    incremental = cfg.teacher.effective_scoring is TeacherScoring.INCREMENTAL
    # room for every concurrently open trajectory (and reruns) before LRU re-scoring
    cap = max(8, 2 * cfg.rollout.concurrency)
    if backend == "hf" and on_ray:
        from thundersync.cluster.ray_actors import RayScorer

        return RayScorer(str(teacher_dir), max_open=cap if incremental else 0), None
    if backend == "hf":
        from thundersync.teacher.scorer import HFScorer

        device = driver_device(cfg, gpus, PlacementRole.TEACHER)
        if incremental:
            from thundersync.teacher.incremental import IncrementalHFScorer

            return IncrementalHFScorer.from_dir(teacher_dir, device=device, max_open=cap), None
        return HFScorer.from_dir(teacher_dir, device=device), None
    if backend != "vllm":
        raise ConfigUnsupported(f"teacher.backend {backend!r}: use hf or vllm")
    from thundersync.rollout.engine_settings import teacher_server_config
    from thundersync.rollout.vllm_server import VLLMServer, engine_on_gpu
    from thundersync.teacher.replicas import TeacherReplicas
    from thundersync.teacher.supervised import SupervisedVLLMScorer

    if not on_ray:
        sc = teacher_server_config(cfg, teacher_dir, on_gpu=engine_on_gpu())
        if gpus is not None:  # its own GPUs under the node's plan
            sc.extra_env = gpus.env(PlacementRole.TEACHER, 0)
        server = VLLMServer(sc, log_dir=files.teacher)
        server.start()
        return SupervisedVLLMScorer(server), server
    from thundersync.cluster.ray_servers import ServerGroup, remote_servers, start_vllm_replicas

    # the model dir must be readable on the replica's node (a shared filesystem)
    sc = teacher_server_config(cfg, teacher_dir, on_gpu=cfg.placement.teacher_gpus > 0)
    # one replica per teacher GPU bundle of the placement (one CPU actor without GPUs)
    servers = remote_servers(start_vllm_replicas(PlacementRole.TEACHER, sc, files.teacher), sc)
    return TeacherReplicas([SupervisedVLLMScorer(s) for s in servers]), ServerGroup(servers)


def driver_device(cfg: RunConfig, gpus: LocalPlan | None, role: PlacementRole) -> torch.device:
    """An in-driver role's device: its own GPU when the node's plan gives it one, else the
    learner's device setting (a one-GPU box shares cuda:0)."""
    import torch

    from thundersync.learner.device import resolve_device

    index = gpus.driver_index(role) if gpus is not None else None
    device = resolve_device(cfg.learner.device)
    return torch.device("cuda", index) if index is not None and device.type == "cuda" else device


def build_rollout_parts(
    cfg: RunConfig,
    files: RunFiles,
    *,
    student: Path,
    teacher_dir: Path | None,
    version: int,
    on_ray: bool,
    gpus: LocalPlan | None = None,
) -> RolloutParts:
    """`gpus`: the node's plan without Ray (an in-driver engine / teacher takes its GPU)."""
    from thundersync.cluster.ray_plan import PlacementRole
    from thundersync.hf_models import load_tokenizer
    from thundersync.learner.device import DTYPES
    from thundersync.rollout.hf_engine import HFEngine

    start = files.weights(version) if version else student
    engine: InferenceEngine
    if cfg.rollout.engine is RolloutEngine.VLLM:
        engine = vllm_replicas(cfg, files, start, version, on_ray=on_ray, gpus=gpus)
    elif on_ray:
        from thundersync.cluster.ray_actors import RayEngine

        engine = RayEngine(str(start), version=version)
    else:
        dtype, device = DTYPES[cfg.model.dtype], driver_device(cfg, gpus, PlacementRole.ROLLOUT)
        engine = HFEngine(start, version=version, dtype=dtype, device=device)
    loop_cfg = AgentLoopConfig(
        max_turns=cfg.rollout.max_turns,
        sampling=SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature
        ),
        concurrency=1,
        tool_workers=2,
        max_total_tokens=cfg.rollout.max_total_tokens,
    )
    parts = RolloutParts(engine, TokenizerChatFormat(load_tokenizer(student)), loop_cfg)
    parts.on_ray = on_ray
    if cfg.rollout.vllm.urls and isinstance(engine, ReplicaSet):
        how = ", ".join(f"{a.method} {a.seconds:.2f} s" for a in engine.last_acks)
        parts.notes.append(
            f"rollout attached to vLLM servers {' '.join(cfg.rollout.vllm.urls)} (not started "
            f"or stopped by this run); start weights v{version} loaded into each: {how}"
        )
    if teacher_dir is not None:
        from thundersync.teacher.client import TeacherClient

        scorer, parts.teacher_server = _scorer(cfg, teacher_dir, files, on_ray, gpus)
        parts.teacher = TeacherClient(
            scorer, timeout_s=cfg.teacher.timeout_s, retries=cfg.teacher.retries, backoff_s=0.2
        )
    return parts
