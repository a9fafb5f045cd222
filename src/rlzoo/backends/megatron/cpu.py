"""``device: cpu`` for the megatron backend: megatron-core's CUDA device calls, sent to the CPU.

megatron-core 0.16 allocates its buffers and scalars on the current CUDA device unconditionally
(``device=torch.cuda.current_device()``, ``device="cuda"``, ``torch.cuda.synchronize()`` in DDP,
the optimizer, grad clipping, the pipeline schedules and p2p). Everything else it does (TP / PP
collectives, the schedules, ``dist_checkpointing``) is plain ``torch.distributed`` and runs on a
gloo group. :func:`cpu_device` is the context every call of a ``device: cpu`` backend runs in:

- a :class:`~torch.overrides.TorchFunctionMode` that rewrites a CUDA device (``"cuda"``,
  ``"cuda:N"``, ``torch.device("cuda")``, a bare index) in factory functions and ``Tensor.to`` to
  the CPU, and makes ``Tensor.cuda()`` a no-op;
- ``Tensor.type()`` naming a CPU tensor as its CUDA type (``torch.cuda.FloatTensor``: megatron's
  optimizers and grad clipping assert on those names);
- ``torch.cuda.current_device`` answering 0 (an index the mode maps to the CPU) and
  ``torch.cuda.synchronize`` / ``torch.cuda.empty_cache`` doing nothing (CPU work is synchronous).

Both are undone on exit. Only for tests and debugging: the numbers are the same as on a GPU in fp32,
not the speed. fp32 only (megatron's bf16 optimizer checks for ``torch.cuda.*Tensor`` types).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["cpu_device"]

_CPU = torch.device("cpu")
_lock = threading.RLock()
_depth = 0
_saved: dict[str, Any] = {}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)  # megatron checks types by name: 'torch.cuda.FloatTensor'
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_device() -> Iterator[None]:
    """Run megatron-core's CUDA device calls on the CPU inside this context (re-entrant)."""
    global _depth
    with _lock:
        if _depth == 0:
            _saved.update(
                current_device=torch.cuda.current_device,
                synchronize=torch.cuda.synchronize,
                empty_cache=torch.cuda.empty_cache,
            )
            torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
            torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
            torch.cuda.empty_cache = lambda: None  # type: ignore[assignment]
        _depth += 1
    try:
        with _CudaToCpu():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, fn in _saved.items():
                    setattr(torch.cuda, name, fn)
                _saved.clear()
