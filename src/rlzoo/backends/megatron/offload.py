"""Parameter / gradient offload: an :class:`Offloader` moves a megatron DDP model's weights (and
gradient buffers) to the CPU between phases and back (storage resize keeps the DDP buffer views
valid, as verl does)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["Offloader"]


class Offloader:
    """What ``param_offload`` / ``grad_offload`` move, and the CPU copies while they are away.

    With ``params`` False every call is a no-op: the models stay on ``device``.
    """

    def __init__(self, device: torch.device, *, params: bool, grads: bool) -> None:
        self.device = device
        self.params = params  # param_offload: the weights leave the device between phases
        self.grads = grads  # grad_offload: the gradient buffers go with them
        #: id(ddp) -> (device tensor, its CPU copy, its storage size) of each tensor moved
        self._saved: dict[int, list[tuple[Tensor, Tensor, int]]] = {}

    def offload(self, ddp: Any) -> None:
        """Copy ``ddp``'s weights (and gradient buffers) to CPU and free their device storage.

        With the distributed optimizer DDP keeps all weights in one contiguous ``param_data``
        buffer per dtype; without it ``param_data`` is None and each parameter owns its storage,
        so the parameters are offloaded one by one.
        """
        if not self.params:
            return
        cuda = self.device.type == "cuda"
        saved = []
        for buf in getattr(ddp, "buffers", []):
            parts = [buf.param_data] if buf.param_data is not None else [p.data for p in buf.params]
            if self.grads and buf.grad_data is not None:
                parts.append(buf.grad_data)
            for t in parts:
                if t.untyped_storage().size() > 0:
                    cpu = t.detach().to("cpu", copy=True)  # copy: on a CPU run .to() would alias
                    saved.append((t, cpu.pin_memory() if cuda else cpu, t.untyped_storage().size()))
                    t.untyped_storage().resize_(0)
        if cuda:
            torch.cuda.synchronize()
        self._saved[id(ddp)] = saved

    def onload(self, ddp: Any) -> None:
        """Bring back what :meth:`offload` moved of ``ddp``."""
        if not self.params:
            return
        for t, cpu, size in self._saved.pop(id(ddp), []):
            t.untyped_storage().resize_(size)
            t.copy_(cpu, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @contextlib.contextmanager
    def resident(self, ddp: Any) -> Iterator[None]:
        """``ddp``'s weights (and gradients) on the device for the block, offloaded again after it
        (``ddp`` None: nothing to move)."""
        if ddp is None:
            yield
            return
        self.onload(ddp)
        try:
            yield
        finally:
            self.offload(ddp)
