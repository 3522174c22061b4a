"""Lossless delta publish: send only the elements that changed since the version every replica
acked.

A bf16 policy trained with an fp32 master at a small learning rate changes few of its published
elements per step (an element moves only when the master crosses a bf16 rounding boundary), so
the learner keeps a copy of the last version every replica acked (`base`, in the published dtype,
on the weights' device) and publishes, per tensor, the flat indices and new values of the elements
whose BITS differ (compared as integers: -0.0 vs +0.0 and NaN payloads count, nothing is lost).
A replica at `base` scatters them into its own parameters and ends bitwise equal to the learner's
weights; one not at `base` gets the full version. When the delta is not smaller than half the
full version (`max_ratio`), the full one is published (the diff stops as soon as it knows).

Why a copy and not the replicas' acks alone: the diff needs the bytes the replicas hold, and the
learner's own parameters have moved on by then. The copy costs one more N bytes in the published
dtype; it is updated in place from the delta after the acks (a scatter, not a copy).

Where the copy lives (`publish.delta_base`): `device`, beside the weights (a GPU diffs at its
bandwidth, but holds the N bytes), or `host` (`host=True`): in host memory, and the new weights
come over in chunks through one staging buffer (pinned for CUDA weights) to be compared there,
so the device holds no base and no full-size transient; the delta's indices and values are then
host tensors. Both find the same elements (the compare is bitwise either way) in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MAX_INDEX = 2**31 - 1  # indices travel as int32
_CHUNK = 1 << 18  # int64 words per compare (2 MiB of each side)


def changed_indices(new: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Flat int64 indices where `new` and `base` differ bit for bit (same shape and dtype).

    Compared 8 bytes at a time (a bf16 tensor read as int64 words: 4 elements per compare), in
    chunks of 2 MiB per side so the mask and its scan stay in cache (measured here: ~2x faster
    than one mask over the whole tensor); only the words that differ are then split into their
    elements. Vectorised throughout: the Python loop is over chunks, never over elements."""
    a = new.detach().reshape(-1)
    b = base.reshape(-1)
    size = a.element_size()
    ai, bi = a.view(_INT[size]), b.view(_INT[size])
    lanes = 8 // size
    words = a.numel() // lanes if lanes > 1 else 0
    if not words or a.storage_offset() % lanes or b.storage_offset() % lanes:
        return torch.ne(ai, bi).nonzero().reshape(-1)
    head = words * lanes
    aw, bw = ai[:head].view(torch.int64), bi[:head].view(torch.int64)
    step = _CHUNK if a.device.type == "cpu" else words  # an accelerator: one pass, one sync
    hits = [
        torch.ne(aw[s : s + step], bw[s : s + step]).nonzero().reshape(-1) + s
        for s in range(0, words, step)
    ]
    hit = torch.cat(hits) if len(hits) > 1 else hits[0]
    if hit.numel() * 4 > words:  # dense: splitting the words costs more than a plain pass
        return torch.ne(ai, bi).nonzero().reshape(-1)
    cand = (hit[:, None] * lanes + torch.arange(lanes, device=a.device)).reshape(-1)
    idx = cand[torch.ne(ai[cand], bi[cand])]
    if head < a.numel():
        tail = torch.ne(ai[head:], bi[head:]).nonzero().reshape(-1) + head
        idx = torch.cat([idx, tail])
    return idx


@dataclass
class Delta:
    """What changed between `base` and `version`: name -> (int32 flat indices, values)."""

    version: int
    base: int
    changes: dict[str, tuple[torch.Tensor, torch.Tensor]]
    changed: int  # elements
    numel: int
    nbytes: int  # indices + values
    full_nbytes: int

    @property
    def changed_fraction(self) -> float:
        return self.changed / max(1, self.numel)


@dataclass
class DeltaTracker:
    """The learner's copy of the last version every replica acked, and the delta against it."""

    # a delta above this share of the full bytes goes out in full: measured here, scattering and
    # indexing a quarter of the elements or more costs more than the bytes it saves
    max_ratio: float = 0.5
    host: bool = False  # the base in host memory, diffed there (`publish.delta_base: host`)
    stage_bytes: int = _CHUNK * 8  # the host diff's staging buffer: a compare chunk, in cache
    base: dict[str, torch.Tensor] = field(default_factory=dict)
    base_version: int | None = None
    last: Delta | None = None  # the most recent diff (published or not), for metrics
    _stage: torch.Tensor | None = field(default=None, repr=False)

    def diff(self, version: int, state: Mapping[str, torch.Tensor]) -> Delta | None:
        """The delta of `state` against the base; None when there is no comparable base (none
        yet, another set of names, shapes or dtypes) or when it is not smaller than the full."""
        if self.base_version is None or list(state) != list(self.base):
            return None
        for k, v in state.items():
            b = self.base[k]
            if v.shape != b.shape or v.dtype != b.dtype or v.numel() > _MAX_INDEX:
                return None
        changes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        changed = numel = nbytes = 0
        full = sum(v.numel() * v.element_size() for v in state.values())
        for k, v in state.items():
            numel += v.numel()
            vals: torch.Tensor | None = None
            if self.host:
                idx, vals = self._host_changes(v, self.base[k])
            else:
                idx = changed_indices(v, self.base[k].to(v.device))
            changed += idx.numel()
            nbytes += idx.numel() * (4 + v.element_size())
            if nbytes >= full * self.max_ratio:  # too big already: stop paying for the diff
                self.last = Delta(version, self.base_version, {}, changed, numel, nbytes, full)
                return None
            if idx.numel():
                # indices and values stay on the weights' device: the segment write copies
                # each once to the host (a GPU: one device-to-host copy, no staging tensor)
                # and the base's update after the acks is a scatter on the device
                # (`host`: both are host tensors already, gathered from the staging buffer)
                if vals is None:
                    vals = v.detach().reshape(-1)[idx]
                changes[k] = (idx.to(torch.int32), vals)
        self.last = Delta(version, self.base_version, changes, changed, numel, nbytes, full)
        return self.last

    def acked(self, version: int, state: Mapping[str, torch.Tensor], delta: Delta | None) -> None:
        """Every replica acked `version`: it becomes the base. After a delta the base takes its
        values in place (a scatter); after a full version it is copied (reusing its storage)."""
        if delta is not None and delta.base == self.base_version:
            for k, (idx, vals) in delta.changes.items():
                b = self.base[k].view(-1)
                b[idx.to(device=b.device, dtype=torch.int64)] = vals.to(b.device)
        else:
            same = list(state) == list(self.base) and all(
                self.base[k].shape == v.shape and self.base[k].dtype == v.dtype
                for k, v in state.items()
            )
            if same:
                for k, v in state.items():
                    self.base[k].copy_(v.detach())
            else:
                self.base = self.place(state)
                for k, v in state.items():
                    self.base[k].copy_(v.detach())
        self.base_version = version

    def place(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Empty, contiguous storage for a base of `state`: beside each tensor, or (`host`) in
        host memory. Not pinned: torch's pinned allocator rounds each block up to a power of two
        (up to 2x the N bytes), and only a full version's copy into it crosses the bus; the
        per-publish traffic goes through the (pinned) staging buffer."""
        if self.host:
            return {k: torch.empty(v.shape, dtype=v.dtype, device="cpu") for k, v in state.items()}
        fmt = torch.contiguous_format
        return {k: torch.empty_like(v.detach(), memory_format=fmt) for k, v in state.items()}

    def _staging(self, like: torch.Tensor) -> torch.Tensor:
        """The host diff's one staging buffer (bytes, a multiple of 8: a chunk boundary keeps the
        base's int64 words aligned), pinned for CUDA weights so each copy runs at full speed."""
        pin = like.device.type == "cuda"
        if self._stage is None or self._stage.is_pinned() != pin:
            size = max(8, self.stage_bytes // 8 * 8)
            self._stage = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        return self._stage

    def _host_changes(
        self, new: torch.Tensor, base: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(int64 flat indices, values) where `new` differs from its host `base`: `new` is copied
        over chunk by chunk into the staging buffer and compared there, its changed values
        gathered out of it (a copy: the buffer is reused by the next chunk)."""
        flat, b = new.detach().reshape(-1), base.view(-1)
        stage = self._staging(new)
        size = new.element_size()
        step = stage.numel() // size
        idxs: list[torch.Tensor] = []
        vals: list[torch.Tensor] = []
        for s in range(0, flat.numel(), step):
            n = min(step, flat.numel() - s)
            part = stage[: n * size].view(new.dtype)
            part.copy_(flat[s : s + n])  # blocking: the chunk is on the host when it returns
            i = changed_indices(part, b[s : s + n])
            if i.numel():
                idxs.append(i + s)
                vals.append(part[i])
        if not idxs:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=new.dtype)
        return torch.cat(idxs), torch.cat(vals)

    def forget(self) -> None:
        """No base any more (a failed publish: the replicas' versions are unknown)."""
        self.base, self.base_version, self.last = {}, None, None
