"""Parameter / gradient offload for :mod:`.train` (storage resize keeps the DDP buffer views valid,
as verl does)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlzoo.backends.megatron.train import MegatronTrainBackend


def offload(backend: MegatronTrainBackend, ddp: Any, grads: bool = True) -> None:
    """Copy the weights (and gradient buffers) to CPU and free their device storage.

    With the distributed optimizer DDP keeps all weights in one contiguous ``param_data``
    buffer per dtype; without it ``param_data`` is None and each parameter owns its storage,
    so the parameters are offloaded one by one.
    """
    cuda = backend.device.type == "cuda"
    saved = []
    for buf in getattr(ddp, "buffers", []):
        parts = [buf.param_data] if buf.param_data is not None else [p.data for p in buf.params]
        if grads and backend.params.grad_offload and buf.grad_data is not None:
            parts.append(buf.grad_data)
        for t in parts:
            if t.untyped_storage().size() > 0:
                cpu = t.detach().to("cpu", copy=True)  # copy: on a CPU run .to() would alias
                saved.append((t, cpu.pin_memory() if cuda else cpu, t.untyped_storage().size()))
                t.untyped_storage().resize_(0)
    if cuda:
        torch.cuda.synchronize()
    backend._offloaded[id(ddp)] = saved


def onload(backend: MegatronTrainBackend, ddp: Any) -> None:
    for t, cpu, size in backend._offloaded.pop(id(ddp), []):
        t.untyped_storage().resize_(size)
        t.copy_(cpu, non_blocking=True)
    if backend.device.type == "cuda":
        torch.cuda.synchronize()
