"""The rollout replicas on vLLM: `rollout.replicas` servers started by the run (locally or as Ray
actors), or the running servers of `rollout.vllm.urls` attached to, each behind a `VLLMEngine`,
together one `ReplicaSet`; and the ids under which they acknowledge a version.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thundersync.config import RolloutEngine, RunConfig
from thundersync.rollout.replicas import ReplicaSet
from thundersync.rundir import RunFiles

if TYPE_CHECKING:
    from thundersync.cluster.local_plan import LocalPlan
    from thundersync.rollout.vllm_server import VLLMServerConfig


def local_env(gpus: LocalPlan | None, replica: int) -> dict[str, str]:
    """Replica `replica`'s CUDA_VISIBLE_DEVICES from the node's plan ({}: the driver's own)."""
    from thundersync.cluster.ray_plan import PlacementRole

    return gpus.env(PlacementRole.ROLLOUT, replica) if gpus is not None else {}


def replica_ids(cfg: RunConfig) -> tuple[str, ...]:
    """The ids under which the rollout replicas acknowledge a version (the learner waits on all)."""
    n = cfg.rollout.replicas if cfg.rollout.engine is RolloutEngine.VLLM else 1
    return tuple(f"engine-{i}" for i in range(n))


def replica_server_config(cfg: RunConfig, model: Path | str, *, on_gpu: bool) -> VLLMServerConfig:
    """The `VLLMServerConfig` of each rollout replica (rollout/engine_settings.py: from
    `rollout.vllm` and the device)."""
    from thundersync.rollout.engine_settings import rollout_server_config

    return rollout_server_config(cfg, model, on_gpu=on_gpu)


def vllm_replicas(
    cfg: RunConfig,
    files: RunFiles,
    start: Path,
    version: int,
    *,
    on_ray: bool = False,
    gpus: LocalPlan | None = None,
) -> ReplicaSet:
    """`rollout.replicas` vLLM servers on `start`, started in parallel; all or none. With Ray
    each is a replica actor in its placement bundle, reached at its node's URL (shared-memory
    weights need the replicas on the learner's host; otherwise `publish.transport: disk` on a
    shared filesystem). With `rollout.vllm.urls` the run starts none: it attaches to those
    servers (rollout/vllm_attach.py) and loads `start` into them."""
    from concurrent.futures import ThreadPoolExecutor

    from thundersync.rollout.vllm_engine import VLLMEngine
    from thundersync.rollout.vllm_server import VLLMServer, engine_on_gpu

    v = cfg.rollout.vllm
    if v.urls:
        return _attached_replicas(cfg, start, version)
    on_gpu = cfg.placement.rollout_gpus > 0 if on_ray else engine_on_gpu()
    sc = replica_server_config(cfg, start, on_gpu=on_gpu)
    log_dir = files.root / "vllm"
    eos = _eos_id(start)
    if on_ray:
        from thundersync.cluster.ray_plan import PlacementRole
        from thundersync.cluster.ray_servers import remote_servers, start_vllm_replicas

        actors = start_vllm_replicas(
            PlacementRole.ROLLOUT, sc, log_dir, replicas=cfg.rollout.replicas
        )
        # VLLMEngine is typed on VLLMServer; remote and attached servers stand in for it by shape
        servers: list[Any] = remote_servers(actors, sc)
    else:
        servers = [
            VLLMServer(replace(sc, extra_env=local_env(gpus, i)), log_dir=log_dir)
            for i in range(cfg.rollout.replicas)
        ]
        with ThreadPoolExecutor(len(servers)) as pool:
            futs = [pool.submit(s.start) for s in servers]
            errors = [f.exception() for f in futs]
        if any(errors):
            for s in servers:
                s.stop()
            raise next(e for e in errors if e is not None)
    tp = v.tensor_parallel_size  # replica i's workers are broadcast ranks 1 + i * tp (learner: 0)
    engines = [
        VLLMEngine(s, version=version, eos_token_id=eos, rank_offset=1 + i * tp)
        for i, s in enumerate(servers)
    ]
    return ReplicaSet(engines, replica_ids(cfg))


def _attached_replicas(cfg: RunConfig, start: Path, version: int) -> ReplicaSet:
    """Engines on the running servers of `rollout.vllm.urls`, every one loaded with `start`
    (version `version`) through the run's publish transport before the first rollout."""
    from thundersync.config import WeightTransport
    from thundersync.learner.device import DTYPES
    from thundersync.rollout.vllm_attach import attach_servers, load_start_weights
    from thundersync.rollout.vllm_engine import VLLMEngine

    v = cfg.rollout.vllm
    tp = v.tensor_parallel_size
    # every trajectory may reach rollout.max_total_tokens: a server that holds fewer is refused
    # here, before any rollout, not at the first long request
    servers: list[Any] = attach_servers(
        v.urls, start, timeout_s=v.attach_timeout_s, need_len=cfg.rollout.max_total_tokens, tp=tp
    )
    eos = _eos_id(start)
    engines = [
        VLLMEngine(s, version=version, eos_token_id=eos, rank_offset=1 + i * tp)
        for i, s in enumerate(servers)
    ]
    replicas = ReplicaSet(engines, replica_ids(cfg))
    t = cfg.publish.transport
    try:
        load_start_weights(
            replicas,
            start,
            version,
            transport="shm" if t is WeightTransport.AUTO else t.value,
            dtype=DTYPES[cfg.model.dtype],
            broadcast_receivers=len(engines) * tp,
        )
    except BaseException:
        replicas.close()  # the engines' HTTP clients; the servers stay up
        raise
    return replicas


def _eos_id(model_dir: Path) -> int | None:
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    eos = cfg.get("eos_token_id")
    return eos if isinstance(eos, int) else None
