"""Clipped value loss for the critic (PPO with GAE). Not a registered kind: the critic update uses it.

verl: ``compute_value_loss`` in ``verl/trainer/ppo/core_algos.py`` (from TRL)::

    v_clip = clip(v, v_old - eps_v, v_old + eps_v)
    loss   = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
    vf_clipfrac = masked_mean((v_clip - R)^2 > (v - R)^2)

Aggregation goes through the same globally normalised ``BoundAgg`` as the policy loss, so the
critic loss is also invariant to the micro-batch split.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlzoo.protocols import BoundAgg

__all__ = ["value_loss"]


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    agg: BoundAgg,
    cliprange_value: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss and metrics.

    Args:
        values: ``[B, T]`` current critic predictions (with gradient).
        old_values: ``[B, T]`` predictions of the critic that produced the advantages.
        returns: ``[B, T]`` regression targets.
        mask: ``[B, T]`` response mask.
        agg: the selected aggregation, bound to the mini-batch's global counts.
        cliprange_value: ``eps_v``; a prediction moves at most this far from ``old_values``
            before its loss stops improving. ``float('inf')`` disables clipping.

    Returns:
        ``(loss, metrics)`` with metrics ``vf_clipfrac`` (fraction of valid tokens where the
        clipped term is the larger), ``vpred_mean`` and ``vf_explained_var`` (detached tensors).
    """
    old_values = old_values.detach()
    returns = returns.detach()
    v_clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)  # [B, T]
    vf_losses1 = (values - returns) ** 2  # [B, T]
    vf_losses2 = (v_clipped - returns) ** 2  # [B, T]
    clipped_vf_losses = torch.maximum(vf_losses1, vf_losses2)  # [B, T]
    loss = 0.5 * agg(clipped_vf_losses, mask)

    with torch.no_grad():
        m = mask.to(values.dtype)  # [B, T]
        n = m.sum() + 1e-8
        vf_clipfrac = (torch.gt(vf_losses2, vf_losses1).to(m.dtype) * m).sum() / n
        vpred_mean = torch.where(m.bool(), values, torch.zeros_like(values)).sum() / n
        ret = torch.where(m.bool(), returns, torch.zeros_like(returns))  # [B, T]
        ret_mean = ret.sum() / n
        ret_var = (((ret - ret_mean) ** 2) * m).sum() / n
        err = torch.where(m.bool(), returns - values, torch.zeros_like(values))  # [B, T]
        err_mean = err.sum() / n
        err_var = (((err - err_mean) ** 2) * m).sum() / n
        explained_var = 1.0 - err_var / (ret_var + 1e-8)
    metrics = {
        "vf_clipfrac": vf_clipfrac.detach(),
        "vpred_mean": vpred_mean.detach(),
        "vf_explained_var": explained_var.detach(),
    }
    return loss, metrics
