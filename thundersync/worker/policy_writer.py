"""Where the learner puts theta_{k+1} for the engines, and which old versions it drops.

shm (default): theta_{k+1} goes into one of `publish.keep_last` shared-memory slots
(rollout/weight_wire.py), rewritten in place in turn, and every replica loads it in place; the disk
is off the critical path. With replicas that ack (`publish.delta: auto` on an accelerator, or `on`), a version whose changed
elements take fewer bytes goes out as a delta against the acked one (rollout/weight_delta.py). broadcast: learner rank 0 sends it over gloo (CPU) / NCCL (CUDA) to every
vLLM worker (rollout/weight_broadcast.py), no copy in between. disk: a safetensors checkpoint per version (the
old path, kept for comparison). Either way a disk copy is also written every `publish.disk_every`
versions (default: every `checkpoint_every`, so a resume finds the weights of its checkpoint) and
for the last version (evaluation and model registration read it); a recorded run (`log_batches`,
for the replay check) keeps every version on disk. Otherwise only the last `publish.keep_last`
versions are kept, plus the newest checkpointed one on disk.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from thundersync.config import RunConfig, WeightTransport
from thundersync.config_serving import DeltaBase, DeltaPublish
from thundersync.rollout.checkpoint import save_checkpoint
from thundersync.rollout.weight_broadcast import WeightBroadcaster
from thundersync.rollout.weight_publisher import ShmPublisher
from thundersync.rollout.weight_wire import SHM_ROOT, segment_path
from thundersync.rundir import RunFiles


class PolicyWriter:
    def __init__(
        self,
        cfg: RunConfig,
        files: RunFiles,
        model_dir: str,
        run_tag: str,
        owners: tuple[int, ...] = (),
        *,
        every_version_on_disk: bool = False,
        acked: bool = True,
    ) -> None:
        self.cfg, self.files, self.model_dir, self.run_tag = cfg, files, model_dir, run_tag
        self.owners = owners  # the learner and its driver: the segment is an orphan once both end
        self.transport = cfg.publish.transport
        self.keep = cfg.publish.keep_last
        # shm slots, reused in turn: a slot is rewritten only after every engine acked a later
        # version; stale schedules do not ack and load up to one version behind: one more
        self.slots = self.keep if acked else max(self.keep, 3)
        # a delta needs replicas that ack every version (its base is the acked one)
        delta = acked and cfg.publish.delta is not DeltaPublish.OFF
        host = cfg.publish.delta is DeltaPublish.ON  # auto: only weights on an accelerator
        self.shm = ShmPublisher(
            run_tag,
            slots=self.slots,
            owners=owners,
            delta=delta,
            from_host=host,
            host_base=cfg.publish.delta_base is DeltaBase.HOST,
        )
        self.broadcaster: WeightBroadcaster | None = None  # made at rank 0's first publish
        self.every_version_on_disk = every_version_on_disk  # a recorded run: replay reads them

    @property
    def disk_every(self) -> int:
        return self.cfg.publish.disk_every or self.cfg.checkpoint_every

    def wants_disk(self, version: int) -> bool:
        every = self.disk_every
        last = version >= self.cfg.updates
        if self.transport is WeightTransport.DISK or last or self.every_version_on_disk:
            return True
        return bool(every and version % every == 0)

    def write(self, version: int, weights: Mapping[str, torch.Tensor]) -> str:
        """Write `version` where the engines read it; returns the uri to publish."""
        disk: Path | None = None
        if self.wants_disk(version):
            disk = save_checkpoint(self.files.weights(version), weights, self.model_dir)
        if self.transport is WeightTransport.DISK:
            assert disk is not None
            return str(disk)
        if self.transport is WeightTransport.BROADCAST:
            if self.broadcaster is None:
                v = self.cfg.rollout
                self.broadcaster = WeightBroadcaster(v.replicas * v.vllm.tensor_parallel_size)
            return self.broadcaster.announce(version, weights)
        return self.shm.write(version, weights)  # a delta against the acked one when smaller

    def send(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """After `PolicyPublished`: the broadcast itself (every replica worker joins it from its
        load); nothing to do for the other transports."""
        if self.broadcaster is not None:
            self.broadcaster.send(version, weights)

    def prune(self, acked: int) -> None:
        """After every engine acked `acked`: drop disk versions older than the last `keep_last`
        (shared memory needs no pruning: its slots are reused)."""
        self.shm.acked(acked)
        floor = acked - self.keep + 1
        root = self.files.weights(0).parent
        if self.every_version_on_disk or not root.is_dir():
            return
        versions = sorted(int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit())
        every = self.cfg.checkpoint_every
        ckpt = max((v for v in versions if every and v % every == 0), default=None)
        for v in versions:
            if v < floor and v != ckpt:
                shutil.rmtree(self.files.weights(v), ignore_errors=True)

    def close(self) -> None:
        self.shm.close()


def remove_run_segments(run_tag: str) -> int:
    """Every segment a run left in shared memory (a killed learner cannot clean up)."""
    stem = segment_path(run_tag, 0).name.removesuffix("-s0.bin")
    n = 0
    for p in SHM_ROOT.glob(f"{stem}-s*.bin*"):
        p.unlink(missing_ok=True)
        n += 1
    return n
