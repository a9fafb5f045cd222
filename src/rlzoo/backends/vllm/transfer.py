"""Weight buckets through shared memory: the driver writes, vLLM's workers read. No vLLM import.

vLLM's ``AsyncLLM`` runs its engine core (and the workers) in other processes, and
``collective_rpc`` arguments cross that boundary through vLLM's msgpack encoder
(``vllm/v1/serial_utils.py``): a tensor in the arguments arrives as ``[dtype, shape, buffer index]``
with its data gone. So ``update_weights`` never passes tensors as RPC arguments. Each bucket is
written once to a safetensors file in shared memory (``/dev/shm`` where it exists), and the RPC
carries only a :class:`BucketRef` as a plain ``dict`` of strings and ints, which msgpack round-trips
exactly. Every TP worker of the engine maps the same file (safetensors reads it with ``mmap``), copies
the tensors to its device and loads them; the driver deletes the file when the RPC has returned
(every worker is done with it).

Works for any placement where the driver and the engine's workers share a host (vLLM's ``mp`` and
``uni`` executors; Ray workers on the same node). Cost: one memory write and one read per worker
per bucket, the same as a CUDA-IPC-less copy. Trainer → engine over NCCL without the driver is the
other path (``rlzoo.distributed.weight_sync`` + ``RlzooWorkerExtension.rlzoo_receive_weights``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["BucketRef", "read_bucket", "shm_dir", "write_bucket"]


def shm_dir() -> str:
    """``/dev/shm`` when it is a writable directory (RAM-backed on Linux), else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


@dataclass(frozen=True)
class BucketRef:
    """Where one bucket lies: a safetensors file, the tensor names in it (in order), its bytes."""

    path: str
    names: tuple[str, ...]
    nbytes: int

    def to_rpc(self) -> dict[str, Any]:
        """A msgpack-safe dict (strings, ints, a list of strings)."""
        d = asdict(self)
        d["names"] = list(self.names)
        return d

    @classmethod
    def from_rpc(cls, d: dict[str, Any]) -> BucketRef:
        return cls(path=str(d["path"]), names=tuple(d["names"]), nbytes=int(d["nbytes"]))


def write_bucket(named: Sequence[tuple[str, Any]], directory: str | None = None) -> BucketRef:
    """Write ``(name, tensor)`` pairs (any device) to a new safetensors file; return its reference.

    Tensors are copied to the CPU and made contiguous; names must be unique (one bucket of
    :func:`~rlzoo.backends.vllm.logic.map_names` output is).
    """
    from safetensors.torch import save_file

    tensors = {}
    for name, t in named:
        if name in tensors:
            raise ValueError(f"write_bucket: tensor {name!r} twice in one bucket")
        tensors[name] = t.detach().to("cpu").contiguous()
    path = Path(directory or shm_dir()) / f"rlzoo-weights-{os.getpid()}-{uuid.uuid4().hex}.safetensors"
    save_file(tensors, str(path))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return BucketRef(path=str(path), names=tuple(tensors), nbytes=nbytes)


def read_bucket(ref: BucketRef, device: Any = "cpu") -> list[tuple[str, Any]]:
    """The bucket's ``(name, tensor)`` pairs, in the written order, on ``device``."""
    from safetensors.torch import load_file

    loaded = load_file(ref.path, device=str(device))
    missing = [n for n in ref.names if n not in loaded]
    if missing:
        raise ValueError(f"read_bucket: {ref.path} lacks {missing[:5]}")
    return [(n, loaded[n]) for n in ref.names]
