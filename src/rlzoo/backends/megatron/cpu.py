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
  ``torch.cuda.synchronize`` / ``torch.cuda.empty_cache`` doing nothing (CPU work is synchronous);
- ``torch.cuda.Stream()`` / ``current_stream()`` one null stream, ``torch.cuda.stream(s)`` a null
  context (the MoE alltoall dispatcher's device-to-host side stream);
- ``torch.autograd.backward`` / ``Tensor.backward`` run straight into the autograd engine with the
  mode on (a mode is off inside its own handler: megatron's autograd functions that allocate in
  backward would otherwise ask for a CUDA device).

All are undone on exit. Only for tests and debugging: the numbers are the same as on a GPU in fp32,
not the speed. fp32 only (megatron's bf16 optimizer checks for ``torch.cuda.*Tensor`` types).

:func:`patch_moe` makes megatron-core's MoE modules run without Transformer Engine and on the CPU
(docs/backends/megatron.md, "Expert and context parallelism").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["cpu_device", "patch_moe"]

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


def _run_backward(func: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """``torch.autograd.backward`` / ``Tensor.backward`` straight into the autograd engine, without
    dispatching to a torch-function mode again (the mode that called this is active around it, so
    megatron's autograd functions that allocate ``device=torch.cuda.current_device()`` in backward,
    the MoE dispatcher's all-gather for one, allocate on the CPU). Plain tensors and keyword names
    as torch's own; ``inputs`` as a tensor or a sequence of them."""
    from torch.autograd import _make_grads
    from torch.autograd.graph import _engine_run_backward

    names = (
        ("self", "gradient", "retain_graph", "create_graph", "inputs")
        if func is torch.Tensor.backward
        else ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
    )
    a: dict[str, Any] = dict(zip(names, args, strict=False)) | kwargs
    tensors: Any = a.get("self", a.get("tensors"))
    grads = a.get("gradient", a.get("grad_tensors"))
    if grads is None:
        grads = a.get("grad_variables")
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    grads = (grads,) if grads is None or isinstance(grads, torch.Tensor) else tuple(grads)
    if len(grads) == 1 and len(tensors) > 1 and grads[0] is None:
        grads = (None,) * len(tensors)
    inputs = a.get("inputs")
    inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    create_graph = bool(a.get("create_graph", False))
    retain_graph = a.get("retain_graph")
    _engine_run_backward(
        tensors,
        _make_grads(tensors, grads, is_grads_batched=False),
        create_graph if retain_graph is None else retain_graph,
        create_graph,
        inputs,
        allow_unreachable=True,
        accumulate_grad=True,
    )


class _NullEvent:
    """A CUDA event stand-in: CPU work is synchronous, so it has always happened."""

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True


class _NullStream:
    """The one stream of the CPU: ``torch.cuda.Stream()`` / ``current_stream()`` are this one object
    (megatron's alltoall dispatcher compares them to decide on a side-stream copy: never here)."""

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _NullEvent:
        return _NullEvent()

    def synchronize(self) -> None:
        return None


_STREAM = _NullStream()


def _null_stream_context(stream: Any = None) -> contextlib.AbstractContextManager[None]:
    """``torch.cuda.stream(s)`` on the CPU: nothing to switch."""
    return contextlib.nullcontext()


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.autograd.backward or func is torch.Tensor.backward:
            with _CudaToCpu():  # the mode is off in its own handler: run backward inside a new one
                return _run_backward(func, args, kwargs)
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
                Stream=torch.cuda.Stream,
                current_stream=torch.cuda.current_stream,
                stream=torch.cuda.stream,
            )
            torch.cuda.Stream = lambda *a, **k: _STREAM  # type: ignore[assignment,misc]
            torch.cuda.current_stream = lambda *a, **k: _STREAM  # type: ignore[assignment]
            torch.cuda.stream = _null_stream_context  # type: ignore[assignment]
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


def patch_moe(moe_utils: Any, token_dispatcher: Any) -> None:
    """megatron-core 0.16.1's MoE modules, made to run without Transformer Engine and on the CPU
    (given ``megatron.core.transformer.moe.moe_utils`` and ``.token_dispatcher``; idempotent):

    - the router reads ``moe_utils.te_general_gemm``, defined only when TE imports: without TE every
      MoE forward fails with ``NameError: name 'te_general_gemm' is not defined`` (on any device).
      Set to ``None``, what the router's own check means by "no TE" (it then uses ``torch.mm``);
      left alone when TE defined it.
    - the alltoall dispatcher's ``maybe_move_tensor_to_cpu`` turns its split sizes into numpy arrays
      only when they are CUDA tensors; CPU tensors stay tensors, which ``all_to_all_single`` refuses
      (``TypeError: all_to_all_single(): incompatible function arguments``). CPU tensors are given
      the same treatment as CUDA ones; CUDA tensors still go through megatron's own function.
    """
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    own = token_dispatcher.maybe_move_tensor_to_cpu
    if getattr(own, "_rlzoo_cpu", False):
        return

    def maybe_move_tensor_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy() if as_numpy else tensor
        return own(tensor, as_numpy=as_numpy, record_stream=record_stream)

    maybe_move_tensor_to_cpu._rlzoo_cpu = True  # type: ignore[attr-defined]
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
