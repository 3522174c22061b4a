"""`tsrl bench publish`: seconds per weight update for each weight transport (disk, shared
memory, broadcast), on real vLLM replicas.

One policy update's publish, as the learner and driver do it: the disk path writes a safetensors
checkpoint and every replica reloads it from disk (`reload_weights(weights_path=...)`); the
shared-memory path writes one segment and every replica loads it in place through the worker
extension; the broadcast path sends it over gloo (NCCL on CUDA) to every replica worker. Same
model, same servers, same perturbed weights, the paths alternating per round; medians over
rounds. `answers_new_weights`: after the last shared-memory load and the last broadcast load (of
the same weights), every replica's sampled log-probs equal an HF forward of them (max gap under
1e-3). On CPU the replicas serve a shared-memory version straight from its segment
(`cpu_weights: map`, rollout/vllm_worker/tsrl_vllm_ext.py), so that load costs no copy.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from thundersync.rollout.checkpoint import save_checkpoint
from thundersync.rollout.replicas import ReplicaSet
from thundersync.rollout.types import SamplingParams
from thundersync.rollout.vllm_engine import VLLMEngine
from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig
from thundersync.rollout.weight_broadcast import WeightBroadcaster
from thundersync.rollout.weight_wire import ShmWeights, segment_path, write_shm

PROMPT = [1, 10, 11, 12, 13, 14, 15]
# untimed rounds first: a run's publisher writes each of its 2 shared-memory slots once as a new
# file (page allocation: ~2 s at SmolLM2 size here) and rewrites them in place from then on; the
# medians are of that steady state (the first rounds' times are reported apart)
WARMUP = 2


def model_dir_for(name: str, root: Path) -> Path:
    if name == "smollm2":
        from thundersync.smollm2 import smollm2_dir

        return smollm2_dir()
    from thundersync.hf_models import build_tiny_model

    return build_tiny_model(root / "tiny", seed=0, hidden=256, layers=4)


def _perturbed(base: dict[str, torch.Tensor], round_: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(round_)
    return {k: v + 1e-3 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in base.items()}


def _answers(model: Any, engines: list[VLLMEngine], version: int) -> float:
    """Max |engine log-prob - HF log-prob of the loaded weights| over every replica."""
    gap = 0.0
    for eng in engines:
        gen = eng.generate(PROMPT, SamplingParams(8, 1.0), seed=7, version=version)
        ids = torch.tensor([PROMPT + gen.token_ids])
        with torch.no_grad():
            lp = model(ids).logits.float().log_softmax(-1)[0, len(PROMPT) - 1 : -1]
        want = lp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        gap = max(gap, float((torch.tensor(gen.logprobs) - want).abs().max()))
    return gap


def _generate_tok_s(engine: VLLMEngine, version: int, n: int = 3) -> float:
    """Decode speed of one request (64 new tokens), median of `n`: what the weight layout costs
    or saves while the replica serves (`cpu_weights: map` runs plain linear layers)."""
    rates = []
    for i in range(n):
        t0 = time.perf_counter()
        g = engine.generate(PROMPT, SamplingParams(64, 1.0), seed=100 + i, version=version)
        rates.append(len(g.token_ids) / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_model(
    name: str, *, rounds: int, replicas: tuple[int, ...], cpu_weights: str = "map"
) -> list[dict[str, Any]]:
    from thundersync.hf_models import load_model

    root = Path(tempfile.mkdtemp(prefix="tsrl-bench-publish-"))
    mdir = model_dir_for(name, root)
    model = load_model(mdir)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for v in base.values())
    cfg = VLLMServerConfig(model=str(mdir), max_model_len=512, cpu_weights=cpu_weights)
    servers = [VLLMServer(cfg, log_dir=root / "log") for _ in range(max(replicas))]
    with ThreadPoolExecutor(len(servers)) as pool:
        for f in [pool.submit(s.start) for s in servers]:
            f.result()
    # tensor parallel 1: replica i is broadcast rank 1 + i
    engines = [VLLMEngine(s, rank_offset=1 + i) for i, s in enumerate(servers)]
    version, out = 0, []
    try:
        for n in replicas:
            rs = ReplicaSet(engines[:n])
            sender = WeightBroadcaster(receivers=n)
            bcast_s: list[float] = []
            disk_s: list[float] = []
            shm_s: list[float] = []
            disk_write: list[float] = []
            shm_write: list[float] = []
            gap = shm_gap = float("nan")
            for r in range(-WARMUP, rounds):  # r < 0: warm-up, not in the medians
                sd = _perturbed(base, r)
                version += 1
                t0 = time.perf_counter()
                path = save_checkpoint(root / f"w{version}", sd, mdir)
                t1 = time.perf_counter()
                rs.load_weights(version, path)
                t2 = time.perf_counter()
                disk_s.append(t2 - t0)
                disk_write.append(t1 - t0)
                # the disk path's background writeback would otherwise slow the next round down
                # (charged to neither path: the disk's durability cost is left out, in its favour)
                os.sync()
                version += 1
                t0 = time.perf_counter()
                # two slots reused in turn, as the learner's publisher does
                slot = segment_path(f"bench-{root.name}", version % 2)
                seg = write_shm(slot, sd, version=version)
                t1 = time.perf_counter()
                rs.load_weights(version, seg.uri)
                t2 = time.perf_counter()
                shm_s.append(t2 - t0)
                shm_write.append(t1 - t0)
                if r == rounds - 1:  # the replicas serve straight from the segment on CPU
                    model.load_state_dict(sd)
                    shm_gap = _answers(model, engines[:n], version)
                version += 1
                t0 = time.perf_counter()  # the learner's announce + send beside every load
                uri = sender.announce(version, sd)
                send = threading.Thread(target=sender.send, args=(version, sd))
                send.start()
                rs.load_weights(version, uri)
                send.join()
                bcast_s.append(time.perf_counter() - t0)
                if r == rounds - 1:  # and on the broadcast load of the same weights
                    gap = max(shm_gap, _answers(model, engines[:n], version))
            first = {"disk": disk_s[:WARMUP], "shm": shm_s[:WARMUP], "broadcast": bcast_s[:WARMUP]}
            del disk_s[:WARMUP], shm_s[:WARMUP], bcast_s[:WARMUP]
            del disk_write[:WARMUP], shm_write[:WARMUP]
            dm, sm = statistics.median(disk_s), statistics.median(shm_s)
            out.append(
                {
                    "model": name,
                    "replicas": n,
                    "gb": round(nbytes / 1e9, 4),
                    "disk_s": round(dm, 4),
                    "shm_s": round(sm, 4),
                    "disk_gb_s": round(nbytes * n / 1e9 / dm, 3),
                    "shm_gb_s": round(nbytes * n / 1e9 / sm, 3),
                    "disk_write_s": round(statistics.median(disk_write), 4),
                    "shm_write_s": round(statistics.median(shm_write), 4),
                    "broadcast_s": round(statistics.median(bcast_s), 4),
                    "speedup_vs_disk": round(dm / sm, 2),
                    "broadcast_speedup_vs_disk": round(dm / statistics.median(bcast_s), 2),
                    "disk_rounds_s": [round(x, 3) for x in disk_s],
                    "shm_rounds_s": [round(x, 3) for x in shm_s],
                    "shm_write_rounds_s": [round(x, 3) for x in shm_write],
                    "broadcast_rounds_s": [round(x, 3) for x in bcast_s],
                    "cpu_weights": cpu_weights,
                    "generate_tok_s": round(_generate_tok_s(engines[0], version), 1),
                    "warmup_rounds_s": {k: [round(x, 3) for x in v] for k, v in first.items()},
                    "max_logprob_gap": gap,
                    "rounds": rounds,
                }
            )
    finally:
        for e in engines:
            e.close()
        for s in (0, 1):
            ShmWeights(segment_path(f"bench-{root.name}", s)).remove()
    return out


def run_weight_transport_bench(
    models: tuple[str, ...] = ("tiny", "smollm2"),
    rounds: int = 3,
    replicas: tuple[int, ...] = (1, 2),
    cpu_weights: str = "map",
) -> dict[str, Any]:
    rows = [
        row
        for m in models
        for row in bench_model(m, rounds=rounds, replicas=replicas, cpu_weights=cpu_weights)
    ]
    gap = max(r["max_logprob_gap"] for r in rows)
    best = min(max(r["speedup_vs_disk"], r["broadcast_speedup_vs_disk"]) for r in rows)
    return {
        "rows": rows,
        "speedup_vs_disk": best,  # the faster in-memory path, worst row
        "shm_speedup_vs_disk": min(r["speedup_vs_disk"] for r in rows),
        "broadcast_speedup_vs_disk": min(r["broadcast_speedup_vs_disk"] for r in rows),
        "answers_new_weights": bool(gap < 1e-3),
        "max_logprob_gap": gap,
        "goal": "in-memory >= 3x faster than disk, and the engines answer with the new weights",
        "goal_met": bool(best >= 3 and gap < 1e-3),
    }
