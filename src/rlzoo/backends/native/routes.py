"""The experts a MoE model's routers chose, recorded by the native engine for router replay.

A trainer that replays the rollout's routing (``trainer.backend.router_replay`` of the megatron
backend; "rollout routing replay", R3 in verl) needs, for every token the rollout fed to the model,
the top-k expert indices of every MoE layer. :class:`RouteRecorder` hooks the router ("gate") of
each MoE layer of a Hugging Face model (Qwen3-MoE / Qwen2-MoE: ``model.layers[i].mlp.gate``, whose
forward returns ``(router_logits, routing_weights, selected_experts)``) and keeps the indices of the
model's last forward; the engine stores them per sequence position
(:meth:`rlzoo.backends.native.batch.BatchSurgery.store_routes`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["RouteRecorder", "moe_gates"]


def moe_gates(model: nn.Module) -> list[nn.Module]:
    """The MoE routers of ``model`` in layer order: modules named ``*.mlp.gate`` that carry
    ``top_k`` and ``num_experts`` (transformers' ``Qwen3MoeTopKRouter`` / ``Qwen2MoeTopKRouter``)."""
    return [
        m
        for name, m in model.named_modules()
        if name.endswith("mlp.gate") and hasattr(m, "top_k") and hasattr(m, "num_experts")
    ]


class RouteRecorder:
    """Forward hooks on a model's MoE routers; :meth:`take` returns the last forward's choices."""

    def __init__(self, gates: list[nn.Module]) -> None:
        if not gates:
            raise ValueError("RouteRecorder: no MoE router given")
        self.top_k = int(gates[0].top_k)  # type: ignore[arg-type]
        self._last: list[Tensor | None] = [None] * len(gates)
        self._handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(gates)]

    @property
    def num_layers(self) -> int:
        return len(self._last)

    def _hook(self, layer: int) -> Callable[[nn.Module, object, object], None]:
        def hook(module: nn.Module, args: object, output: object) -> None:
            indices = output[2] if isinstance(output, tuple) and len(output) == 3 else None
            if not isinstance(indices, Tensor) or indices.is_floating_point():
                raise TypeError(
                    f"router replay: the MoE router {type(module).__name__} of layer {layer} returned "
                    f"{type(output).__name__}, not (router_logits, routing_weights, selected_experts)"
                )
            self._last[layer] = indices.detach().to(torch.int16)  # [tokens, top_k]

        return hook

    def take(self, rows: int, width: int) -> Tensor:
        """The last forward's expert indices ``[rows, width, layers, top_k]`` (int16) for its input
        ``[rows, width]`` (the routers see the tokens flattened row-major); cleared after."""
        if any(t is None for t in self._last):
            raise RuntimeError("router replay: a forward did not reach every MoE router")
        per_layer = [t.reshape(rows, width, self.top_k) for t in self._last if t is not None]
        self._last = [None] * len(self._last)
        return torch.stack(per_layer, dim=2)  # [rows, width, layers, top_k]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
