"""Router replay on the megatron backend: the actor routes every token to the experts the rollout chose.

"Rollout routing replay" (R3 in verl): the rollout records, per token and MoE layer, the top-k
expert indices it used (``batch["routed_experts"]`` ``[B, S, layers, top_k]``, -1 where none was
recorded; :mod:`rlzoo.backends.native.routes`), and the trainer's routers use them instead of their
own top-k. megatron-core 0.16 has the mechanism (``TransformerConfig.moe_enable_routing_replay``:
each ``TopKRouter`` gets a ``RouterReplay``; with the action ``REPLAY_FORWARD`` its top-k returns
the given indices and the router's own scores gathered at them), so the routing weights are still
computed from the trainer's router logits and their gradients reach the router: for Qwen3-MoE
(``pre_softmax`` off) a softmax over the chosen experts' logits, for Qwen2-MoE the full softmax's
probabilities at the chosen experts.

:func:`replay_indices` turns a micro-batch's routes into each local router's ``[tokens, top_k]``
(pure tensor code); :func:`replaying` sets them on the routers for one forward and clears them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_routes", "replay_indices", "replaying", "routers_of"]


def check_routes(batch: Any, *, num_layers: int, top_k: int) -> None:
    """Refuse a batch without the rollout's routes, or with routes of another model's shape."""
    if "routed_experts" not in batch:
        raise ValueError(
            "trainer.backend.router_replay: the batch has no routed_experts (the experts the rollout "
            "chose per token); the rollout backend must record them (rollout.backend.record_routes: true "
            "on the native backend), or set router_replay false"
        )
    routes = batch["routed_experts"]  # [B, S, layers, top_k]
    S = batch["input_ids"].shape[1]
    if routes.dim() != 4 or tuple(routes.shape[1:]) != (S, num_layers, top_k):
        raise ValueError(
            f"trainer.backend.router_replay: routed_experts has shape {tuple(routes.shape)}, expected "
            f"[B, {S}, {num_layers}, {top_k}] (sequence width, the model's MoE layers, its top_k)"
        )


def replay_indices(
    routes: Tensor,
    *,
    first_layer: int,
    num_layers: int,
    num_experts: int,
    tp: int = 1,
    tp_rank: int = 0,
    sequence_parallel: bool = False,
) -> list[Tensor]:
    """The top-k indices ``[tokens, top_k]`` (int64) of each of this stage's routers, layers
    ``first_layer ..`` ``+ num_layers``, for a micro-batch whose routes are ``[b, S, layers, top_k]``.

    megatron's router sees the tokens sequence-major (``[S, b]`` flattened), and with sequence
    parallelism only this TP rank's contiguous ``S / tp`` positions. A token without a valid
    record (-1: padding or the last response token, whose outputs are never read; a row with a
    repeated or out-of-range expert) is sent to experts ``0 .. top_k-1``.
    """
    _, S, _, k = routes.shape
    local = routes[:, :, first_layer : first_layer + num_layers].long()  # [b, S, l, k]
    local = local.transpose(0, 1)  # [S, b, l, k]: the router's token order
    if sequence_parallel and tp > 1:
        if S % tp:
            raise ValueError(f"router replay: sequence width {S} is not divisible by the TP size {tp}")
        local = local[tp_rank * (S // tp) : (tp_rank + 1) * (S // tp)]
    local = local.reshape(-1, num_layers, k)  # [tokens, l, k]
    ordered = local.sort(-1).values  # [tokens, l, k]
    repeated = (ordered[..., 1:] == ordered[..., :-1]).any(-1)  # [tokens, l]
    bad = (local < 0).any(-1) | (local >= num_experts).any(-1) | repeated  # [tokens, l]
    fill = torch.arange(k, device=local.device).expand_as(local)  # [tokens, l, k]
    local = torch.where(bad[..., None], fill, local)  # [tokens, l, k]
    return [local[:, j].contiguous() for j in range(num_layers)]


def routers_of(model: Any) -> list[Any]:
    """The ``RouterReplay`` of each MoE router of ``model`` (one stage), in layer order."""
    return [m.router_replay for m in model.modules() if getattr(m, "router_replay", None) is not None]


@contextlib.contextmanager
def replaying(replays: Sequence[Any]) -> Iterator[None]:
    """Within: each router replays the indices given to its ``set_target_indices`` (forward).
    After: the routers compute their own top-k again and hold no indices."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    for r in replays:
        r.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    try:
        yield
    finally:
        for r in replays:
            r.clear_router_replay_action()
            r.clear_indices()


def forget(replays: Sequence[Any]) -> None:
    """Drop ``replays`` from megatron's process-wide list of router-replay instances (a backend
    shut down; megatron only ever appends to it)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    mine = {id(r) for r in replays}
    RouterReplay.global_router_replay_instances[:] = [
        r for r in RouterReplay.global_router_replay_instances if id(r) not in mine
    ]
