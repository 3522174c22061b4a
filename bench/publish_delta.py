"""`tsrl bench publish` (delta part): full vs delta shared-memory publish of real training steps.

SmolLM2-135M with an fp32 master, published in bf16 (what a bf16 policy with master weights
publishes): real AdamW steps on a real causal-LM loss at each learning rate, the bf16 versions
kept, then published into the same engine twice, once in full (`ShmPublisher(delta=False)`) and
once as deltas against the acked version, the two passes alternating over rounds. Per step: the
changed fraction, the bytes each sends, and the time from the publish call (diff + write) to the
engine's ack. `bitwise_equal`: after the last delta the engine's weights (vLLM: its served,
fused parameters) equal the learner's bf16 weights bit for bit. Before the timed steps each pass
publishes the start version twice (the slots are allocated, and a CPU vLLM replica moves from
the mapped segment to storage of its own: one-time costs a long run pays once).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from thundersync.rollout.weight_publisher import ShmPublisher

BF16 = torch.bfloat16
TEXT = (
    "The learner publishes its weights to every rollout replica after each optimizer step. "
    "Replicas acknowledge the version they loaded, and the next update starts only then. "
    "Small learning rates move few bf16 elements per step, so a delta is much smaller."
)
_FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def train_versions(
    model_dir: Path, lr: float, steps: int, device: str, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """bf16 versions theta_0..theta_steps of real AdamW steps (fp32 master) on a causal-LM loss."""
    from thundersync.hf_models import load_model, load_tokenizer

    torch.manual_seed(seed)
    model: Any = load_model(model_dir, dtype=torch.float32)
    model = model.to(device).train()
    tok: Any = load_tokenizer(model_dir)
    ids = tok(TEXT, return_tensors="pt")["input_ids"].to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    out = [{k: v.detach().to(BF16) for k, v in model.state_dict().items()}]
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append({k: v.detach().to(BF16) for k, v in model.state_dict().items()})
    return out


def served_equal(served: dict[str, torch.Tensor], sd: dict[str, torch.Tensor]) -> bool:
    """The learner's tensors, stacked as vLLM serves them (qkv, gate_up; a padded vocabulary
    compared on its real rows), bitwise equal to the served parameters."""
    for name, p in served.items():
        mod, _, leaf = name.rpartition(".")
        parent, _, last = mod.rpartition(".")
        srcs = [f"{parent}.{x}.{leaf}" for x in _FUSED[last]] if last in _FUSED else [name]
        want = torch.cat([sd[s].cpu() for s in srcs])
        got = p[: want.shape[0]]
        if got.dtype != want.dtype or got.shape != want.shape:
            return False
        if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            return False
    return True


class _Target:
    """The engine the versions go into, and how to read its weights back."""

    def __init__(self, engine: str, model_dir: Path, device: str, root: Path) -> None:
        self.kind = engine
        if engine == "hf":
            from thundersync.rollout.hf_engine import HFEngine

            self.engine: Any = HFEngine(model_dir, dtype=BF16, device=device)
        else:
            from thundersync.rollout.vllm_engine import VLLMEngine
            from thundersync.rollout.vllm_server import VLLMServer, VLLMServerConfig

            cfg = VLLMServerConfig(model=str(model_dir), dtype="bfloat16", max_model_len=256)
            server = VLLMServer(cfg, log_dir=root / "logs")
            server.start()
            self.engine = VLLMEngine(server)
        self.root = root

    def weights_equal(self, sd: dict[str, torch.Tensor]) -> bool:
        if self.kind == "hf":
            got = self.engine.model.state_dict()
            return all(torch.equal(got[k].view(torch.int16), sd[k].view(torch.int16)) for k in sd)
        from thundersync.rollout.vllm_engine import post_json

        path = self.root / "served.pt"
        body = {"method": "tsrl_save_params", "kwargs": {"path": str(path)}}
        post_json(self.engine._client, f"{self.engine.server.url}/collective_rpc", body, 120)
        return served_equal(dict(torch.load(path)), sd)

    def close(self) -> None:
        self.engine.close()


def _pass(
    target: _Target, versions: list[dict[str, torch.Tensor]], delta: bool, v0: int, tag: str
) -> tuple[list[dict[str, Any]], int]:
    """Publish theta_0 twice (untimed), then theta_1.. timed; per step: kind, bytes, seconds."""
    shm = ShmPublisher(tag, delta=delta)
    rows: list[dict[str, Any]] = []
    v = v0
    try:
        for i, sd in enumerate([versions[0], *versions]):
            v += 1
            t0 = time.perf_counter()
            uri = shm.write(v, sd)
            ack = target.engine.load_weights(v, uri)
            dt = time.perf_counter() - t0
            shm.acked(v)
            if ack.version != v:
                raise RuntimeError(f"the engine acked v{ack.version}, not v{v}")
            if i >= 2:
                rows.append({**shm.last, "seconds": dt, "method": ack.method})
    finally:
        shm.close()
    return rows, v


def bench_delta(
    *,
    lrs: tuple[float, ...] = (1e-6, 1e-4),
    steps: int = 4,
    rounds: int = 2,
    engine: str = "vllm",
    device: str = "cpu",
    model_dir: Path | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    if model_dir is None:
        from thundersync.smollm2 import smollm2_dir

        model_dir = smollm2_dir()
    root = Path(tempfile.mkdtemp(prefix="tsrl-bench-delta-"))
    target = _Target(engine, model_dir, device, root)
    tag = f"bench-delta-{os.getpid()}"
    rows: list[dict[str, Any]] = []
    v = 0
    try:
        for lr in lrs:
            t0 = time.perf_counter()
            versions = train_versions(model_dir, lr, steps, device)
            log(f"lr {lr}: {steps} AdamW steps in {time.perf_counter() - t0:.1f}s")
            full: list[dict[str, Any]] = []
            dlt: list[dict[str, Any]] = []
            for _ in range(rounds):  # the two passes alternate: same load on both
                r, v = _pass(target, versions, False, v, f"{tag}-f")
                full += r
                r, v = _pass(target, versions, True, v, f"{tag}-d")
                dlt += r
            equal = target.weights_equal(versions[-1])
            fs, ds = (
                statistics.median(x["seconds"] for x in full),
                statistics.median(x["seconds"] for x in dlt),
            )
            fb = full[0]["full_bytes"]
            steps_rows = [
                {
                    "step": i % steps + 1,
                    "changed_fraction": round(d["changed_fraction"] or 0.0, 6),
                    "kind": d["kind"],
                    "full_bytes": fb,
                    "delta_bytes": d["bytes"],
                    "full_s": round(f["seconds"], 4),
                    "delta_s": round(d["seconds"], 4),
                    "delta_write_s": round(d["write_s"], 4),
                }
                for i, (f, d) in enumerate(zip(full, dlt, strict=True))
            ]
            rows.append(
                {
                    "lr": lr,
                    "engine": engine,
                    "device": device,
                    "full_bytes": fb,
                    "changed_fraction": round(
                        statistics.median(s["changed_fraction"] for s in steps_rows), 6
                    ),
                    "delta_bytes_ratio": round(statistics.median(d["bytes"] for d in dlt) / fb, 5),
                    "full_s": round(fs, 4),
                    "delta_s": round(ds, 4),
                    "delta_speedup": round(fs / ds, 2),
                    "delta_kinds": sorted({d["kind"] for d in dlt}),
                    "bitwise_equal": equal,
                    "steps": steps_rows,
                }
            )
            log(f"lr {lr}: { ({k: x for k, x in rows[-1].items() if k != 'steps'}) }")
            del versions
    finally:
        target.close()
    main = rows[0]
    return {
        "delta_bytes_ratio": main["delta_bytes_ratio"],
        "delta_speedup": main["delta_speedup"],
        "bitwise_equal": all(r["bitwise_equal"] for r in rows),
        "changed_fraction": main["changed_fraction"],
        "delta_lr": main["lr"],
        "delta_engine": engine,
        "delta_goal_met": bool(
            main["delta_bytes_ratio"] <= 0.1
            and main["delta_speedup"] >= 3
            and main["bitwise_equal"]
        ),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "delta_rows": rows,
    }
