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

import torch
from torch import Tensor

# the KL-in-reward controllers and penalty are used by the core's policy trainer: they live in its formulas
from ..kl import (
    AbsParams,
    AbsPlusParams,
    FullParams,
    K1Params,
    K1PlusParams,
    K2Params,
    K3Params,
    K3PlusParams,
)

__all__ = [
    "abs_kl",
    "abs_kl_plus",
    "full",
    "k1",
    "k1_plus",
    "k2",
    "k3",
    "k3_plus",
    "straight_through",
]


def k1(log_probs: Tensor, ref_log_probs: Tensor, params: K1Params | None = None) -> Tensor:
    """``log p - log p_ref`` (unbiased, high variance, can be negative)."""
    return log_probs - ref_log_probs  # [B, T]


def abs_kl(log_probs: Tensor, ref_log_probs: Tensor, params: AbsParams | None = None) -> Tensor:
    """``|log p - log p_ref|``."""
    return (log_probs - ref_log_probs).abs()  # [B, T]


def k2(log_probs: Tensor, ref_log_probs: Tensor, params: K2Params | None = None) -> Tensor:
    """``(log p - log p_ref)**2 / 2`` (verl ``mse``)."""
    return 0.5 * (log_probs - ref_log_probs).square()  # [B, T]


def k3(log_probs: Tensor, ref_log_probs: Tensor, params: K3Params | None = None) -> Tensor:
    """``exp(log p_ref - log p) - (log p_ref - log p) - 1``, clamped like verl's ``low_var_kl``."""
    kl = torch.clamp(ref_log_probs - log_probs, min=-20, max=20)  # [B, T]
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)  # [B, T]


def full(log_probs: Tensor, ref_log_probs: Tensor, params: FullParams | None = None) -> Tensor:
    """Exact ``KL(p || p_ref) = sum_v p_v (log p_v - log p_ref_v)`` per token, from ``[B, T, V]``
    log-probabilities over the whole vocabulary (verl's ``full``, which verl 0.9.1 leaves
    unimplemented). Returns ``[B, T]``."""
    if log_probs.dim() != 3 or ref_log_probs.shape != log_probs.shape:
        raise ValueError(
            "kl 'full' needs log-probabilities over the whole vocabulary, [B, T, V] for both the "
            f"policy and the reference; got {tuple(log_probs.shape)} and {tuple(ref_log_probs.shape)} "
            "(per-token log-probs of the sampled tokens only fit k1 / k2 / k3)"
        )
    return (log_probs.exp() * (log_probs - ref_log_probs)).sum(-1)  # [B, T]


def straight_through(value: Tensor, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Forward ``value``, backward the gradient of ``k2`` (verl's ``+`` suffix)."""
    backward = k2(log_probs, ref_log_probs)  # [B, T]
    return backward - backward.detach() + value.detach()  # [B, T]


def k1_plus(log_probs: Tensor, ref_log_probs: Tensor, params: K1PlusParams | None = None) -> Tensor:
    """Value of ``k1``, gradient of ``k2``."""
    return straight_through(k1(log_probs, ref_log_probs), log_probs, ref_log_probs)


def abs_kl_plus(log_probs: Tensor, ref_log_probs: Tensor, params: AbsPlusParams | None = None) -> Tensor:
    """Value of ``abs``, gradient of ``k2``."""
    return straight_through(abs_kl(log_probs, ref_log_probs), log_probs, ref_log_probs)


def k3_plus(log_probs: Tensor, ref_log_probs: Tensor, params: K3PlusParams | None = None) -> Tensor:
    """Value of ``k3`` (``low_var_kl``), gradient of ``k2``."""
    return straight_through(k3(log_probs, ref_log_probs), log_probs, ref_log_probs)
