"""vLLM rollout and teacher replicas as Ray actors, each reporting the URL it serves at.

A replica actor runs in its role's GPU bundle (cluster/ray_pg.py), starts a `VLLMServer` bound to
its node's address on a port free there (Ray gives the actor its GPUs through
CUDA_VISIBLE_DEVICES, which the server inherits) and reports `http://NODE_IP:PORT`: the driver
cannot guess either, since Ray picks the node. The server dies with its actor (teacher/lifeline.py).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from thundersync.cluster.ray_plan import PlacementRole
from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig


class NodeVLLMServer(VLLMServer):
    """A `VLLMServer` reached at the host it binds (the base class assumes loopback)."""

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"


class VLLMReplicaActor:
    """One rollout or teacher replica: a vLLM server on this actor's node and GPUs."""

    def __init__(
        self, config: VLLMServerConfig, log_dir: str, env: dict[str, str] | None = None
    ) -> None:
        import ray

        from thundersync.cluster.ray_pg import free_port_on

        os.environ.update(env or {})  # e.g. TSRL_VLLM_PYTHON, VLLM_* settings of this node
        host = ray.util.get_node_ip_address()
        extra = list(config.extra_args)
        if config.tensor_parallel_size > 1 and "--distributed-executor-backend" not in extra:
            # the replica's GPUs are all on this node: vLLM's own workers, not a Ray of its own
            extra += ["--distributed-executor-backend", "mp"]
        cfg = replace(config, host=host, port=config.port or free_port_on(host), extra_args=extra)
        self.server = NodeVLLMServer(cfg, log_dir=Path(log_dir))

    def start(self) -> str:
        """Start the server if it is not running (blocks until /health answers); its URL."""
        if not self.server.is_healthy():
            self.server.start()
        return self.server.url

    def url(self) -> str:
        return self.server.url

    def healthy(self) -> bool:
        return self.server.is_healthy()

    def log_path(self) -> str:
        return str(self.server.log_path)  # on this actor's node

    def restart(self, model: str | None = None) -> str:
        self.server.restart(model)
        return self.server.url

    def stop(self) -> None:
        self.server.stop()

    def where(self) -> dict[str, Any]:
        from thundersync.cluster.ray_pg import actor_where

        return actor_where()


def start_vllm_replicas(
    role: PlacementRole,
    config: VLLMServerConfig,
    log_dir: str | Path,
    *,
    replicas: int = 1,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """One `VLLMReplicaActor` per replica of `role`: as many as the active placement gives the
    role GPU bundles for (each in its own), else `replicas` CPU actors. Servers start with
    `replica_urls`."""
    import ray

    from thundersync.cluster.ray_pg import active_placement, actor_options

    placement = active_placement()
    planned = len(placement.plan.of(role)) if placement is not None else 0
    remote: Any = ray.remote
    cls: Any = remote(max_concurrency=4)(VLLMReplicaActor)  # url()/stop() while starting
    out = []
    for i in range(planned or replicas):
        opts = actor_options(role, i, cpus=0)
        out.append(cls.options(**opts).remote(config, str(Path(log_dir) / f"{role}-{i}"), env))
    return out


def replica_urls(actors: list[Any], timeout_s: float | None = None) -> list[str]:
    """Start every replica's server, all at once, and return their URLs in replica order."""
    import ray

    return [str(u) for u in ray.get([a.start.remote() for a in actors], timeout=timeout_s)]


class RemoteVLLMServer:
    """What `rollout.vllm_engine.VLLMEngine` uses of a `VLLMServer`, over a replica actor: the
    engine then talks HTTP to the replica's node and restarts it through the actor (a model path
    it is given must be readable on that node: a shared filesystem)."""

    def __init__(
        self, actor: Any, url: str, config: VLLMServerConfig, log_path: str = "<on its node>"
    ) -> None:
        self.actor = actor
        self.url = url
        self.config = config
        self.model = config.model
        self.log_path = Path(log_path)  # quoted in errors (teacher/supervised.py)

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        import ray

        return bool(ray.get(self.actor.healthy.remote(), timeout=timeout_s + 5))

    def start(self, model: str | None = None) -> None:
        if model is not None:
            self.restart(model)
        else:
            self._get(self.actor.start.remote())

    def restart(self, model: str | None = None) -> None:
        self.url = str(self._get(self.actor.restart.remote(model)))  # same port: same URL
        if model is not None:
            self.model = model

    def stop(self) -> None:
        import ray

        self._get(self.actor.stop.remote())
        ray.kill(self.actor)

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self.config.start_timeout_s + 30)


def remote_servers(
    actors: list[Any], config: VLLMServerConfig, timeout_s: float | None = None
) -> list[RemoteVLLMServer]:
    """Start the replicas (`start_vllm_replicas`) and wrap each for `VLLMEngine(server)`."""
    import ray

    urls = replica_urls(actors, timeout_s)
    logs = ray.get([a.log_path.remote() for a in actors])
    return [
        RemoteVLLMServer(a, u, config, str(log))
        for a, u, log in zip(actors, urls, logs, strict=True)
    ]


def stop_replicas(actors: list[Any]) -> None:
    import ray

    ray.get([a.stop.remote() for a in actors])
    for a in actors:
        ray.kill(a)


class ServerGroup:
    """Replica servers stopped together (the teacher replicas of a run)."""

    proc = None  # no local process to signal: each server lives in its actor

    def __init__(self, servers: list[RemoteVLLMServer]) -> None:
        self.servers = servers

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
