"""KL estimators, KL controllers and the KL reward penalty (behind :mod:`rlzoo.algorithms.kl`).

Estimators are ``fn(log_probs [B, T], ref_log_probs [B, T], params) -> kl [B, T]`` (per token, not
masked) and match verl's ``kl_penalty`` (Schulman, http://joschu.net/blog/kl-approx.html). With
``d = log_probs - ref_log_probs``:

- ``k1``: ``d``;  ``abs``: ``|d|``;  ``k2``: ``d**2 / 2``;
- ``k3`` (``low_var_kl``): ``exp(-d) + d - 1``, ``-d`` clamped to [-20, 20] before ``exp`` and the
  result clamped to [-10, 10];
- ``<name>+``: straight-through, the value of ``<name>`` with the gradient of ``k2`` (whose
  expected gradient is the gradient of the KL).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "abs_kl",
    "abs_kl_plus",
    "apply_kl_penalty",
    "k1",
    "k1_plus",
    "k2",
    "k3",
    "k3_plus",
    "straight_through",
]


def k1(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """``log p - log p_ref`` (unbiased, high variance, can be negative)."""
    return log_probs - ref_log_probs  # [B, T]


def abs_kl(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """``|log p - log p_ref|``."""
    return (log_probs - ref_log_probs).abs()  # [B, T]


def k2(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """``(log p - log p_ref)**2 / 2`` (verl ``mse``)."""
    return 0.5 * (log_probs - ref_log_probs).square()  # [B, T]


def k3(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """``exp(log p_ref - log p) - (log p_ref - log p) - 1``, clamped like verl's ``low_var_kl``."""
    kl = torch.clamp(ref_log_probs - log_probs, min=-20, max=20)  # [B, T]
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)  # [B, T]


def straight_through(value: Tensor, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Forward ``value``, backward the gradient of ``k2`` (verl's ``+`` suffix)."""
    backward = k2(log_probs, ref_log_probs)  # [B, T]
    return backward - backward.detach() + value.detach()  # [B, T]


def k1_plus(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """Value of ``k1``, gradient of ``k2``."""
    return straight_through(k1(log_probs, ref_log_probs), log_probs, ref_log_probs)


def abs_kl_plus(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """Value of ``abs``, gradient of ``k2``."""
    return straight_through(abs_kl(log_probs, ref_log_probs), log_probs, ref_log_probs)


def k3_plus(log_probs: Tensor, ref_log_probs: Tensor, params: Any = None) -> Tensor:
    """Value of ``k3`` (``low_var_kl``), gradient of ``k2``."""
    return straight_through(k3(log_probs, ref_log_probs), log_probs, ref_log_probs)


# ---------------------------------------------------------------------------------------------
# controllers and the reward penalty
# ---------------------------------------------------------------------------------------------
class FixedKLController:
    """A constant KL coefficient (``update`` does nothing)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 (https://arxiv.org/abs/1909.08593).

    ``value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon`` (verl's rule).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if horizon <= 0:
            raise ValueError(f"horizon must be larger than 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: Tensor, kl: Tensor, mask: Tensor, coef: float
) -> tuple[Tensor, dict[str, float]]:
    """``rewards = scores - coef * kl * mask`` (verl ``apply_kl_penalty``).

    Returns the token-level rewards and metrics: ``reward_kl_penalty`` (per-sequence masked mean
    of the KL, averaged over sequences: what a controller's ``update`` takes) and
    ``reward_kl_penalty_coeff``. A fully masked row counts as KL 0 (verl divides by zero there).
    """
    mask = mask.to(kl.dtype)  # [B, T]
    kld = kl * mask  # [B, T]
    rewards = token_level_scores - coef * kld  # [B, T]
    per_seq = kld.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    current_kl = float(per_seq.mean().item()) if per_seq.numel() else 0.0
    return rewards, {"reward_kl_penalty": current_kl, "reward_kl_penalty_coeff": float(coef)}
