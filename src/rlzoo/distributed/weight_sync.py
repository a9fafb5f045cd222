"""Bucketed weight broadcast from trainer rank 0 to the rollout workers over a torch.distributed group.

The group ("sync group") is a standalone process group (gloo on CPU, NCCL on GPU) built from a
``TCPStore`` on trainer rank 0's node; it is independent of any default group a train backend
creates, so the trainer's own SPMD group and the sync group never interfere. Rank 0 of the sync
group is trainer rank 0 (the source); ranks 1.. are the other members (rollout replicas, and in
colocated mode the other trainer ranks, which host rollout replicas too).

Wire format, one round per bucket (all broadcasts from rank 0)::

    header  int64[3]  (meta_bytes, bucket_bytes, last)   last=1 ends the sync (sizes then 0)
    meta    uint8[meta_bytes]  pickled [(name, dtype, shape, offset), ...]
    bucket  uint8[bucket_bytes] the tensors' bytes, each at a 16-byte aligned offset

A bucket holds consecutive tensors of the export iterator up to ``bucket_bytes`` (a larger tensor
travels alone). Tensors are sent as raw bytes, so every dtype (fp32, bf16, int, bool) round-trips
bit-exactly, and mixed dtypes share a bucket. Rank 0 consumes the train backend's
``export_weights()`` lazily: at most one bucket is materialised at a time on any rank.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlzoo.distributed.buckets import iter_bucketed

__all__ = [
    "ALIGN",
    "SyncStats",
    "TorchSyncGroup",
    "flatten_bucket",
    "iter_buckets",
    "receive_weights",
    "send_weights",
    "unflatten_bucket",
]

logger = logging.getLogger("rlzoo.distributed")

ALIGN = 16  # byte alignment of each tensor inside a bucket (any dtype's view is then legal)

#: ``broadcast(tensor)``: in-place broadcast from rank 0 of the sync group
Broadcast = Callable[[Tensor], None]
Meta = list[tuple[str, torch.dtype, tuple[int, ...], int]]


# ---------------------------------------------------------------------------------------------
# buckets (pure tensor code)
# ---------------------------------------------------------------------------------------------
def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def iter_buckets(
    named: Iterable[tuple[str, Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, Tensor]]]:
    """Group consecutive ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` (aligned).

    A tensor larger than ``bucket_bytes`` forms a bucket of its own. Lazy: pulls one pair at a time.
    """
    return iter_bucketed(named, _nbytes, bucket_bytes, ALIGN)


def flatten_bucket(
    items: list[tuple[str, Tensor]], device: torch.device | str | None = None
) -> tuple[Tensor, Meta]:
    """Pack tensors into one ``uint8`` buffer; returns ``(buffer [nbytes], meta)``."""
    meta: Meta = []
    offset = 0
    for name, t in items:
        meta.append((name, t.dtype, tuple(t.shape), offset))
        offset += _aligned(_nbytes(t))
    dev = device if device is not None else (items[0][1].device if items else "cpu")
    buf = torch.empty(offset, dtype=torch.uint8, device=dev)  # [nbytes]
    for (_, t), (_, _, _, off) in zip(items, meta):
        n = _nbytes(t)
        if n:
            src = t.detach().contiguous().reshape(-1).view(torch.uint8)  # [n]
            buf[off : off + n].copy_(src.to(buf.device), non_blocking=True)
    return buf, meta


def unflatten_bucket(buf: Tensor, meta: Meta) -> list[tuple[str, Tensor]]:
    """Inverse of :func:`flatten_bucket`: ``(name, tensor)`` views into ``buf`` (no copy)."""
    out: list[tuple[str, Tensor]] = []
    for name, dtype, shape, off in meta:
        numel = 1
        for s in shape:
            numel *= s
        n = numel * torch.empty((), dtype=dtype).element_size()
        t = buf[off : off + n].view(dtype).reshape(shape)
        out.append((name, t))
    return out


# ---------------------------------------------------------------------------------------------
# the protocol over a broadcast function
# ---------------------------------------------------------------------------------------------
@dataclass
class SyncStats:
    """What one sync moved, for logs and benchmarks."""

    version: int = -1
    bytes: int = 0
    tensors: int = 0
    buckets: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "weight_sync/bytes": float(self.bytes),
            "weight_sync/seconds": self.seconds,
            "weight_sync/gb_per_s": self.gb_per_s,
            "weight_sync/buckets": float(self.buckets),
            "weight_sync/tensors": float(self.tensors),
        }

    def log(self) -> None:
        logger.info(
            "weight sync v%d: %.1f MB, %d tensors in %d buckets, %.3f s (%.2f GB/s)",
            self.version,
            self.bytes / 1e6,
            self.tensors,
            self.buckets,
            self.seconds,
            self.gb_per_s,
        )


def send_weights(
    named: Iterable[tuple[str, Tensor]],
    broadcast: Broadcast,
    bucket_bytes: int,
    *,
    device: torch.device | str = "cpu",
    stats: SyncStats | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """Rank 0: broadcast ``named`` bucket by bucket; yields what was sent (views into each bucket).

    A generator: nothing is sent until it is iterated, and it must be iterated to the end (the
    last round tells the receivers to stop). Feed it to a local rollout backend's
    ``update_weights`` (colocated) or just drain it.
    """
    stats = stats if stats is not None else SyncStats()
    t0 = time.perf_counter()
    for items in iter_buckets(named, bucket_bytes):
        buf, meta = flatten_bucket(items, device)
        blob = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8).to(device)
        broadcast(torch.tensor([blob.numel(), buf.numel(), 0], dtype=torch.int64, device=device))
        broadcast(blob)
        broadcast(buf)
        stats.bytes += buf.numel()
        stats.tensors += len(meta)
        stats.buckets += 1
        yield from unflatten_bucket(buf, meta)
    broadcast(torch.tensor([0, 0, 1], dtype=torch.int64, device=device))
    stats.seconds = time.perf_counter() - t0


def receive_weights(
    broadcast: Broadcast, *, device: torch.device | str = "cpu", stats: SyncStats | None = None
) -> Iterator[tuple[str, Tensor]]:
    """Ranks > 0: receive buckets until rank 0's last round; yields ``(name, tensor)``."""
    stats = stats if stats is not None else SyncStats()
    t0 = time.perf_counter()
    while True:
        header = torch.zeros(3, dtype=torch.int64, device=device)  # [meta_bytes, bucket_bytes, last]
        broadcast(header)
        meta_n, buf_n, last = (int(x) for x in header.tolist())
        if last:
            break
        blob = torch.empty(meta_n, dtype=torch.uint8, device=device)
        broadcast(blob)
        meta: Meta = pickle.loads(blob.cpu().numpy().tobytes())
        buf = torch.empty(buf_n, dtype=torch.uint8, device=device)
        broadcast(buf)
        stats.bytes += buf_n
        stats.tensors += len(meta)
        stats.buckets += 1
        yield from unflatten_bucket(buf, meta)
    stats.seconds = time.perf_counter() - t0


def apply_and_drain(
    apply: Callable[[Iterable[tuple[str, Tensor]]], None], stream: Iterator[tuple[str, Tensor]]
) -> None:
    """``apply(stream)``, then finish ``stream`` even if ``apply`` stopped early or raised.

    Every member must take part in every broadcast round, or the others block; an error while
    applying is re-raised only after the collective is complete.
    """
    try:
        apply(stream)
    finally:
        for _ in stream:
            pass


# ---------------------------------------------------------------------------------------------
# the process group
# ---------------------------------------------------------------------------------------------
class TorchSyncGroup:
    """A standalone torch.distributed group (not the default group) for the weight broadcast.

    Every member constructs it at the same time with the same ``host:port`` (rank 0 hosts the
    ``TCPStore``). ``backend``: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors).
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        backend: str = "gloo",
        timeout_s: float = 300.0,
    ) -> None:
        import torch.distributed as dist

        self.rank, self.world_size, self.backend = rank, world_size, backend
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        self._store: Any = store  # keep the store (rank 0 hosts it) alive as long as the group
        prefixed = dist.PrefixStore("rlzoo-weight-sync", store)
        if backend == "gloo":
            self.pg: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        else:
            raise ValueError(f"weight sync backend must be 'gloo' or 'nccl', got {backend!r}")
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )

    def broadcast(self, tensor: Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def send(
        self, named: Iterable[tuple[str, Tensor]], bucket_bytes: int, stats: SyncStats | None = None
    ) -> Iterator[tuple[str, Tensor]]:
        return send_weights(named, self.broadcast, bucket_bytes, device=self.device, stats=stats)

    def receive(self, stats: SyncStats | None = None) -> Iterator[tuple[str, Tensor]]:
        return receive_weights(self.broadcast, device=self.device, stats=stats)

    def close(self) -> None:
        self.pg = None
        self._store = None


def free_port() -> int:
    """A TCP port free on this host right now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
