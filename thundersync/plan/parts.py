"""The plan's components, one method per part of the learner (`plan.memory` says what is planned
and why). Learner-device parts are per learner GPU, or, for a CPU learner, host parts; host parts
count every learner rank of the node; shm parts count once."""

from __future__ import annotations

from dataclasses import dataclass

from thundersync.config import LOSSLESS_SCHEDULES, AccumDevice, Objective, OpdTurnGraphs, RunConfig
from thundersync.config_serving import DeltaBase, DeltaPublish, WeightTransport
from thundersync.learner.routing import ring_numel
from thundersync.plan import activations as act
from thundersync.plan.shape import ModelShape

_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}


@dataclass(frozen=True)
class Component:
    name: str
    where: str  # gpu (per learner GPU) | host (the learner node) | shm (/dev/shm on that node)
    phase: str  # static: always held; else a transient of that phase
    bytes: int
    formula: str


def bytes_of(dtype: str) -> int:
    return _BYTES[dtype]


def accum_on_gpu(cfg: RunConfig, on_gpu: bool) -> bool:
    return on_gpu and cfg.learner.accum_device is AccumDevice.DEVICE


def shm_slots(cfg: RunConfig) -> tuple[int, bool]:
    """(full slots in /dev/shm, whether a delta segment is written too)."""
    p = cfg.publish
    if p.transport not in (WeightTransport.AUTO, WeightTransport.SHM):
        return 0, False
    return p.keep_last, p.delta is not DeltaPublish.OFF


def keep_turn_graphs(cfg: RunConfig, on_gpu: bool) -> bool:
    mode = cfg.learner.opd_turn_graphs
    return (not on_gpu) if mode is OpdTurnGraphs.AUTO else mode is OpdTurnGraphs.KEEP


def learner_parts(cfg: RunConfig, s: ModelShape, *, on_gpu: bool) -> list[Component]:
    p = _Parts(cfg, s, on_gpu)
    p.weights()
    p.accumulators()
    p.activations()
    p.barrier()
    p.publish()
    return p.out


class _Parts:
    def __init__(self, cfg: RunConfig, s: ModelShape, on_gpu: bool) -> None:
        lc, m = cfg.learner, cfg.model
        self.cfg, self.s, self.on_gpu = cfg, s, on_gpu
        self.b = bytes_of(m.dtype)
        self.m = 4 if self.b == 2 else self.b  # fp32 master for 16-bit compute (parallel.py)
        self.a = bytes_of(lc.accum_dtype)
        # GRPO G1 / G2 (and leaf ledgers): float64 with `learner.grpo_sum: float64`, else `a`
        grpo = cfg.objective is Objective.GRPO
        self.g = 8 if grpo and str(getattr(lc, "grpo_sum", "arrival")) == "float64" else self.a
        # the update's parts: fp32 parts share a split fp64 sum (two vectors, update_sum.py);
        # fp64 parts: the first is adopted as the plain fp64 sum (one vector)
        self.split = self.g == 4
        lora = s.lora_params(m.lora_rank, m.lora_targets) if m.lora_rank else 0
        self.n_all = s.params + lora  # every parameter the model holds
        self.n_t = lora or s.params  # trainable: what the sums and AdamW cover
        self.w, self.k, self.t = lc.ranks, lc.max_open_groups, cfg.rollout.max_total_tokens
        self.dev = "gpu" if on_gpu else "host"
        self.acc = self.dev if accum_on_gpu(cfg, on_gpu) or not on_gpu else "host"
        # the fp32 master / shards and AdamW state (`learner.optimizer_device`)
        self.opt = "host" if lc.optimizer_device == "host" else self.dev
        self.out: list[Component] = []

    def add(
        self, name: str, where: str, phase: str, nbytes: float, formula: str, once: bool = False
    ) -> None:
        mult = self.w if where == "host" and not once else 1
        suffix = f" x {self.w} ranks" if mult > 1 else ""
        self.out.append(Component(name, where, phase, int(nbytes) * mult, formula + suffix))

    def weights(self) -> None:
        b, m, w, n_t = self.b, self.m, self.w, self.n_t
        self.add(
            "weights (full replica on every rank)", self.dev, "static", self.n_all * b, f"N x {b} B"
        )
        if w > 1:
            self.add(
                "FSDP2 master shards (fp32)",
                self.opt,
                "static",
                self.n_all * m / w,
                f"N x {m} B / {w}",
            )
            self.add(
                "AdamW moments (sharded)",
                self.opt,
                "static",
                2 * n_t * m / w,
                f"2 x N_t x {m} B / {w}",
            )
            self.add(
                "FSDP2 init: one tensor at a time (full + its shard)",
                self.opt,
                "startup",
                2 * self.s.largest_param * m,
                f"2 x largest x {m} B",
            )
        else:
            if m != b or self.opt != self.dev:
                self.add("master weights (fp32 copy)", self.opt, "static", n_t * m, f"N_t x {m} B")
            self.add("AdamW moments", self.opt, "static", 2 * n_t * m, f"2 x N_t x {m} B")
        if not self.on_gpu and not self.cfg.model.lora_rank and not self.s.tied:
            wide = max(b, 4)
            self.add(
                "LM head dW scratch (host routing)",
                self.dev,
                "static",
                self.s.head_params * wide,
                f"V x d x {wide} B (learner/routed_ops.py)",
            )

    def accumulators(self) -> None:
        k, n_t = self.k, self.n_t
        grpo = self.cfg.objective is Objective.GRPO
        per_open, g = (2, self.g) if grpo else (1, self.a)
        what = "G1 + G2 per open group" if grpo else "own sum per open trajectory"
        self.add(
            f"accumulators ({what})",
            self.acc,
            "update",
            per_open * k * n_t * g,
            f"{per_open} x max_open_groups {k} x N_t x {g} B",
        )
        if self.split:
            self.add("update sum (two closed parts)", self.acc, "update", 8 * n_t, "2 x N_t x 4 B")
        else:
            self.add("update sum (fp64, one vector)", self.acc, "update", 8 * n_t, "N_t x 8 B")

    def activations(self) -> None:
        s, b, t, k, lc = self.s, self.b, self.t, self.k, self.cfg.learner
        per_layer = lc.activation_checkpointing == "layer"
        opd = self.cfg.objective is Objective.OPD
        # OPD turns run in segments of at most S tokens: own activations scale with S, the rest
        # of the context is past K/V in the store (counted below)
        seg_s = lc.opd_segment_tokens if opd else None
        seg = act.worst_segment(s, b, t, self.on_gpu, per_layer, most_own=seg_s)
        what = "segment of T tokens"
        if opd:  # named apart: the advice's knob for it is learner.opd_segment_tokens
            what = "OPD segment of min(T, S) tokens" if seg_s else "OPD turn of T tokens"
        self.add(
            f"activations: one {what}",
            self.dev,
            "update",
            seg,
            f"T={t}{f', S={seg_s}' if seg_s else ''}: " + act.formula_note(s, b),
        )
        chunk = min(lc.logprob_chunk, t)
        wide = max(b, 4)
        head = 2 * chunk * s.vocab * wide + (s.vocab * s.hidden * (wide + b) if self.on_gpu else 0)
        tail = " + V x d x (4 + b) B (dW fp32 + its cast)" if self.on_gpu else ""
        self.add(
            "LM head: logits chunks + dW",
            self.dev,
            "update",
            head,
            f"2 x {chunk} x V x {wide} B{tail}",
        )
        kv_all = s.layers * 2 * s.kv_dim
        if self.cfg.objective is Objective.GRPO:
            kept = act.kept_prompt(s, b, lc.activation_checkpointing)
            self.add(
                "GRPO prompt graphs of the other open groups",
                self.dev,
                "update",
                (k - 1) * t * kept,
                f"(max_open_groups - 1) x T x {kept} B/token",
            )
            self.add(
                "GRPO prompt-leaf adjoint sums (leaf_g1, leaf_g2)",
                self.dev,
                "update",
                2 * k * t * kv_all * self.g,
                f"2 x max_open_groups x T x {kv_all} x {self.g} B",
            )
            return
        self.add(
            "OPD K/V stores + fp32 ledgers (capacity <= T, regrown a layer at a time)",
            self.dev,
            "update",
            k * t * kv_all * (b + wide),
            f"T x max_open_groups x {kv_all} x ({b} + {wide}) B",
        )
        self.add(
            "OPD past-leaf adjoint (one layer's K/V grads at a time)",
            self.dev,
            "update",
            act.leaf_adjoint(s, b, t),
            f"T x 2 x {s.kv_dim} x {b} B",
        )
        if keep_turn_graphs(self.cfg, self.on_gpu):
            kept = act.kept_prompt(s, b, lc.activation_checkpointing)
            # one kept graph per segment: a turn of n tokens is ceil(n / S) of them
            graphs = self.cfg.rollout.max_turns + (-(-t // seg_s) if seg_s else 0)
            rep = s.layers * act.layer_kv(s, b, True)
            self.add(
                "OPD kept turn graphs (opd_turn_graphs: keep)",
                self.dev,
                "update",
                (k - 1) * (t * kept + graphs * t * rep),
                f"(max_open_groups - 1) x (T x {kept} + {graphs} graphs x T x {rep}) B",
            )

    def barrier(self) -> None:
        m, w, n_t, dev = self.m, self.w, self.n_t, self.dev
        if w > 1:
            # finish() reduces one fp64 bucket at a time as it reads it and narrows the result
            # into the sum's own buffers (update_sum.py): no widened copy
            if self.split:
                held = "update sum: fp64 split over the two fp32 parts (finished, clipped in place)"
                formula = "2 x N_t x 4 B"
            else:
                held, formula = "update sum (fp64, one vector; finished in place)", "N_t x 8 B"
            for phase in ("reduce", "step"):
                self.add(held, self.acc, phase, 8 * n_t, formula)
            if not self.split:
                self.add("clipped gradient (grad x clip)", self.acc, "step", 4 * n_t, "N_t x 4 B")
            mb = self.cfg.learner.reduce_bucket_mb
            bucket = min(8 * n_t, int(mb * 2**20))
            note = f"min(N_t x 8 B, reduce_bucket_mb {mb:g} MiB)"
            self.add(
                "fp64 reduce bucket (read, reduced, finished)", self.acc, "reduce", bucket, note
            )
            if self.on_gpu and self.acc == "host":
                self.add("fp64 reduce bucket on the GPU (NCCL)", dev, "reduce", bucket, note)
            self.add("FSDP2 gradient shards", self.opt, "step", n_t * m / w, f"N_t x {m} B / {w}")
            big = self.s.largest_param * m * 2
            self.add(
                "one whole tensor (grad copy, full_tensor)",
                self.opt,
                "step",
                big,
                f"2 x largest x {m} B",
            )
        elif self.on_gpu and self.opt == dev:
            self.add("step gradient copied to the device", dev, "step", n_t * m, f"N_t x {m} B")
        if self.on_gpu and self.acc == "host":
            a, big = self.a, self.s.largest_param
            ring = ring_numel(big, n_t, a) * a
            self.add(
                "pinned gradient staging ring",
                "host",
                "static",
                ring,
                f"min(pow2(max(2 x largest x {a} B, 256 MiB)), N_t x {a} B)",
            )
        if self.cfg.checkpoint_every:
            # one rank: copied to the host tensor by tensor (`Learner.state_dict`); FSDP2 ranks:
            # a DCP save of this rank's master + AdamW shards (checkpoint_dcp.py), staged to the
            # host at most whole (no replica, nothing gathered)
            if w > 1:
                self.add(
                    "checkpoint: DCP save of this rank's master + AdamW shards",
                    "host",
                    "checkpoint",
                    3 * n_t * m / w,
                    f"<= 3 x N_t x {m} B / {w}",
                )
            else:
                self.add("checkpoint: master copy", "host", "checkpoint", n_t * m, f"N_t x {m} B")

    def publish(self) -> None:
        cfg, s, b = self.cfg, self.s, self.b
        slots, delta = shm_slots(cfg)
        lossless = cfg.schedule in LOSSLESS_SCHEDULES
        if slots and not lossless:
            slots = max(slots, 3)  # stale schedules load one version behind without acking
        full = s.params * b
        if slots:
            self.add(
                f"/dev/shm publish slots ({slots})",
                "shm",
                "static",
                slots * full,
                f"{slots} x N x {b} B",
            )
        on = cfg.publish.delta is DeltaPublish.ON or (delta and self.on_gpu)
        if slots and on and lossless:
            self.add("/dev/shm delta segment", "shm", "static", full // 2, "<= N x b / 2")
            # publish.delta_base: host keeps the base in host memory and diffs there (the
            # weights cross in 2 MiB pinned chunks): the delta is built on the host too
            where = "host" if cfg.publish.delta_base is DeltaBase.HOST else self.dev
            self.add(
                f"delta base: acked weights (rank 0, publish.delta_base {cfg.publish.delta_base})",
                where,
                "static",
                full,
                f"N x {b} B",
                once=True,
            )
            self.add(
                "delta diff: indices + values",
                where,
                "publish",
                full // 2,
                "<= N x b / 2",
                once=True,
            )
