"""Rollout / trainer mismatch diagnostics, logged every step whatever rollout correction is selected.

The policy trainer logs them under ``rollout_corr/`` when no correction part is selected (a
correction part reports them itself, see :mod:`rlzoo.algorithms.functional.correction`). Names and
formulas follow verl's ``rollout_corr_helper.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
