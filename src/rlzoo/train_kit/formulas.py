"""The formulas the core and the built-in algorithms share (the one core math module ``algorithms/`` imports).

- masked means / maxima and the rollout / trainer mismatch diagnostics, logged every step whatever
  rollout correction is selected: the policy trainer logs them under ``rollout_corr/`` when no
  correction part is selected (a correction part reports them itself, see
  :mod:`rlzoo.algorithms.functional.correction`); names and formulas follow verl's
  ``rollout_corr_helper.py``;
- the aggregation context of a mini-batch (:func:`make_agg_context`);
- the critic's clipped value loss (:func:`value_loss`);
- KL in the reward: the fixed and adaptive controllers and :func:`apply_kl_penalty`.

Pure functions over tensors: nothing here imports the loop (:mod:`rlzoo.train`) or the sources.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlzoo.kernel.protocols import AggContext, BoundAgg

#: exponents are clamped to [-SAFETY_BOUND, SAFETY_BOUND] before exp (as verl)
SAFETY_BOUND = 20.0


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over ``mask`` (all of it, or along ``dim``); 0 where the mask is empty."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_max(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Max of ``x`` over ``mask``; 0 where the mask is empty."""
    filled = x.masked_fill(mask <= 0, -torch.inf)
    out = filled.amax() if dim is None else filled.amax(dim)
    return torch.where(torch.isinf(out) & (out < 0), torch.zeros_like(out), out)


@torch.no_grad()
def offpolicy_metrics(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Mismatch diagnostics between the trainer's and the rollout engine's log-probs (unprefixed).

    Perplexities are per sequence, ``exp(-mean_t log p)``, averaged over the sequences that have at
    least one token. ``kl`` is the k1 estimate of KL(pi_rollout || pi_train), ``k3_kl`` the k3 one;
    ``chi2_token`` / ``chi2_seq`` are E[rho^2] - 1 per token / per sequence;
    ``rollout_probs_diff_*`` are statistics of ``|p_rollout - p_train|`` over tokens.
    """
    mask = mask.to(old_log_probs.dtype)  # [B, T]
    # padding may hold anything (inf after exp): zero it before any nonlinearity
    old_log_probs = torch.where(mask > 0, old_log_probs, 0.0)  # [B, T]
    rollout_log_probs = torch.where(mask > 0, rollout_log_probs, 0.0)  # [B, T]
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    log_ratio = old_log_probs - rollout_log_probs  # [B, T]
    mean_lp_train = masked_mean(old_log_probs, mask, dim=-1)  # [B]
    mean_lp_rollout = masked_mean(rollout_log_probs, mask, dim=-1)  # [B]
    log_ppl_diff = mean_lp_rollout - mean_lp_train  # [B]
    probs_diff = (rollout_log_probs.exp() - old_log_probs.exp()).abs()  # [B, T]
    pd_mean = masked_mean(probs_diff, mask)  # []
    pd_var = masked_mean((probs_diff - pd_mean).square(), mask)  # []
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]
    seq_log_ratio = (log_ratio * mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B]
    return {
        "training_ppl": masked_mean(torch.exp(-mean_lp_train), seq_valid),
        "training_log_ppl": masked_mean(-mean_lp_train, seq_valid),
        "rollout_ppl": masked_mean(torch.exp(-mean_lp_rollout), seq_valid),
        "rollout_log_ppl": masked_mean(-mean_lp_rollout, seq_valid),
        "log_ppl_diff": masked_mean(log_ppl_diff, seq_valid),
        "log_ppl_abs_diff": masked_mean(log_ppl_diff.abs(), seq_valid),
        "log_ppl_diff_max": masked_max(log_ppl_diff, seq_valid),
        "log_ppl_diff_min": -masked_max(-log_ppl_diff, seq_valid),
        "ppl_ratio": masked_mean(torch.exp(log_ppl_diff), seq_valid),
        "kl": masked_mean(-log_ratio, mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "chi2_token": masked_mean(torch.exp(rho).square(), mask) - 1.0,
        "chi2_seq": masked_mean(torch.exp(2.0 * seq_log_ratio), seq_valid) - 1.0,
        "rollout_probs_diff_mean": pd_mean,
        "rollout_probs_diff_max": masked_max(probs_diff, mask),
        "rollout_probs_diff_std": pd_var.sqrt(),
    }


# ---------------------------------------------------------------------------------------------
# The aggregation context of a mini-batch
# ---------------------------------------------------------------------------------------------
def make_agg_context(
    mask: torch.Tensor,
    max_response_length: int | None = None,
    *,
    loss_scale_factor: float = 1.0,
) -> AggContext:
    """The global normalisers of one mini-batch, from its full response mask ``[B, T]``.

    ``mask`` must be the mask of the **whole** mini-batch (before it is cut into micro-batches).
    Across data-parallel ranks, sum ``global_tokens`` and ``global_sequences`` over ranks (e.g.
    an ``all_reduce`` of the two counts) before building the context, so every rank divides by
    the same totals. ``max_response_length`` (``T`` of seq-mean-token-sum-norm) defaults to the
    mask's padded width, which is what verl uses; pass the configured maximum to make the
    normaliser independent of how a batch happens to be padded.
    """
    m = mask.detach().bool()  # [B, T]
    global_tokens = float(m.sum().item())
    global_sequences = float(m.any(dim=-1).sum().item())
    if max_response_length is None:
        max_response_length = int(mask.shape[-1])
    return AggContext(
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        max_response_length=int(max_response_length),
        loss_scale_factor=float(loss_scale_factor),
    )


# ---------------------------------------------------------------------------------------------
# The critic's clipped value loss (verl ``compute_value_loss``, from TRL)
#
#     v_clip = clip(v, v_old - eps_v, v_old + eps_v)
#     loss   = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
#     vf_clipfrac = masked_mean((v_clip - R)^2 > (v - R)^2)
#
# Aggregation goes through the same globally normalised ``BoundAgg`` as the policy loss, so the
# critic loss is also invariant to the micro-batch split.
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# KL in the reward: controllers and the penalty
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
