"""Off-policy (rollout) corrections: the tensor code behind :mod:`rlzoo.algorithms.correction`.

Every part is ``fn(inputs: CorrectionInputs, params) -> CorrectionOutput``. With the per-token log
ratio ``rho_t = old_log_probs - rollout_log_probs`` (log of pi_train / pi_rollout):

- importance weights (detached): token ``exp(rho_t)`` or sequence ``exp(sum_t rho_t)`` (product of
  the token ratios), exponent clamped to [-20, 20], truncated above at ``threshold`` (TIS);
- IcePop: tokens whose ratio leaves [low, high] are masked out; the kept ones are weighted by
  their ratio;
- rejection: per token or per sequence (sum / mean / max over the tokens) of k1 = -rho (kept when
  the ratio lies in [ratio_low, ratio_high]), k2 = rho^2 / 2 or k3 = exp(rho) - 1 - rho (kept when
  at most ``threshold``), as verl's ``rollout_rs`` options ``token_k1`` ... ``seq_max_k3``.

Names and metrics follow verl's ``rollout_corr_helper.py``. Metrics are detached 0-dim tensors
(no host sync here) under the ``rollout_corr/`` prefix.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from rlzoo.protocols import CorrectionInputs, CorrectionOutput

__all__ = [
    "SAFETY_BOUND",
    "icepop",
    "importance_weights",
    "none",
    "offpolicy_metrics",
    "rejection",
    "rejection_mask",
    "seq_is",
    "token_is",
]

#: exponents are clamped to [-SAFETY_BOUND, SAFETY_BOUND] before exp (as verl)
SAFETY_BOUND = 20.0
MODES = ("decoupled", "bypass")
PREFIX = "rollout_corr/"


def _check_mode(params: Any) -> str:
    mode = getattr(params, "mode", "decoupled")
    if mode not in MODES:
        raise ValueError(f"rollout_correction mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def _masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def _masked_max(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    filled = x.masked_fill(mask <= 0, -torch.inf)
    out = filled.amax() if dim is None else filled.amax(dim)
    return torch.where(torch.isinf(out) & (out < 0), torch.zeros_like(out), out)


def _masked_min(x: Tensor, mask: Tensor) -> Tensor:
    out = x.masked_fill(mask <= 0, torch.inf).amin()
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


def _prefixed(metrics: dict[str, Tensor]) -> dict[str, float | Tensor]:
    return {PREFIX + k: v.detach() for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------
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
    mean_lp_train = _masked_mean(old_log_probs, mask, dim=-1)  # [B]
    mean_lp_rollout = _masked_mean(rollout_log_probs, mask, dim=-1)  # [B]
    log_ppl_diff = mean_lp_rollout - mean_lp_train  # [B]
    probs_diff = (rollout_log_probs.exp() - old_log_probs.exp()).abs()  # [B, T]
    pd_mean = _masked_mean(probs_diff, mask)  # []
    pd_var = _masked_mean((probs_diff - pd_mean).square(), mask)  # []
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]
    seq_log_ratio = (log_ratio * mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B]
    return {
        "training_ppl": _masked_mean(torch.exp(-mean_lp_train), seq_valid),
        "training_log_ppl": _masked_mean(-mean_lp_train, seq_valid),
        "rollout_ppl": _masked_mean(torch.exp(-mean_lp_rollout), seq_valid),
        "rollout_log_ppl": _masked_mean(-mean_lp_rollout, seq_valid),
        "log_ppl_diff": _masked_mean(log_ppl_diff, seq_valid),
        "log_ppl_abs_diff": _masked_mean(log_ppl_diff.abs(), seq_valid),
        "log_ppl_diff_max": _masked_max(log_ppl_diff, seq_valid),
        "log_ppl_diff_min": -_masked_max(-log_ppl_diff, seq_valid),
        "ppl_ratio": _masked_mean(torch.exp(log_ppl_diff), seq_valid),
        "kl": _masked_mean(-log_ratio, mask),
        "k3_kl": _masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "chi2_token": _masked_mean(torch.exp(rho).square(), mask) - 1.0,
        "chi2_seq": _masked_mean(torch.exp(2.0 * seq_log_ratio), seq_valid) - 1.0,
        "rollout_probs_diff_mean": pd_mean,
        "rollout_probs_diff_max": _masked_max(probs_diff, mask),
        "rollout_probs_diff_std": pd_var.sqrt(),
    }


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def importance_weights(
    log_ratio: Tensor,
    mask: Tensor,
    level: str,
    threshold: float | None,
    batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated IS weights ``[B, T]`` (zero on padding, detached) and their metrics (unprefixed)."""
    if level == "token":
        log_w = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]
        unit_mask = mask  # statistics over tokens
        unit_log_w = log_ratio  # [B, T]
    elif level == "sequence":
        seq = (log_ratio * mask).sum(-1, keepdim=True)  # [B, 1] log of the product of ratios
        log_w = seq.clamp(-SAFETY_BOUND, SAFETY_BOUND).expand_as(log_ratio)  # [B, T]
        unit_mask = (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)  # [B, 1] statistics over sequences
        unit_log_w = seq  # [B, 1]
    else:
        raise ValueError(f"importance weight level must be 'token' or 'sequence', got {level!r}")
    weights = torch.exp(log_w) * mask  # [B, T]
    unit_w = torch.exp(unit_log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))  # [B, T] or [B, 1]
    metrics = {
        "is_mean": _masked_mean(unit_w, unit_mask),
        "is_max": _masked_max(unit_w, unit_mask),
        "is_min": _masked_min(unit_w, unit_mask),
    }
    if threshold is not None:
        if threshold <= 0:
            raise ValueError(f"importance weight threshold must be positive, got {threshold}")
        log_hi = math.log(threshold)
        metrics["is_ratio_fraction_high"] = _masked_mean((unit_log_w > log_hi).to(mask.dtype), unit_mask)
        metrics["is_ratio_fraction_low"] = _masked_mean((unit_log_w < -log_hi).to(mask.dtype), unit_mask)
        # ESS = 1 / E[(w / E[w])^2] on weights clamped to [1 / threshold, threshold] (verl)
        w_ess = unit_w.clamp(min=1.0 / threshold, max=threshold)
        w_norm = w_ess / (_masked_mean(w_ess, unit_mask) + 1e-8)
        metrics["is_eff_sample_size"] = 1.0 / _masked_mean(w_norm.square(), unit_mask).clamp(min=1e-12)
        weights = weights.clamp(max=threshold)  # [B, T] TIS
    if batch_normalize:
        norm = (
            _masked_mean(weights, mask)
            if level == "token"
            else _masked_mean(_masked_mean(weights, mask, dim=-1), unit_mask.squeeze(-1))
        )
        metrics["is_batch_norm_factor"] = norm
        weights = torch.where(norm > 1e-8, weights / norm.clamp(min=1e-8), weights)  # [B, T]
    return weights.detach(), metrics


@torch.no_grad()
def rejection_mask(
    log_ratio: Tensor,
    mask: Tensor,
    metric: str,
    agg: str,
    threshold: float,
    ratio_low: float,
    ratio_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Keep mask ``[B, T]`` (1 kept, 0 rejected) from a k1 / k2 / k3 statistic; metrics unprefixed.

    k1 bounds the ratio itself: kept when ``ratio_low <= r <= ratio_high`` where ``r`` is the token
    ratio (``token``), the sequence ratio (``seq_sum``) or its geometric mean (``seq_mean``). k2 / k3
    are kept when the statistic is at most ``threshold``.
    """
    aggs = ("token", "seq_sum", "seq_mean", "seq_max")
    if agg not in aggs:
        raise ValueError(f"rejection agg must be one of {aggs}, got {agg!r}")
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]
    if metric == "k1":
        if agg == "seq_max":
            raise ValueError("rejection metric 'k1' supports agg token, seq_sum or seq_mean, not seq_max")
        if not 0 < ratio_low <= ratio_high:
            raise ValueError(f"need 0 < ratio_low <= ratio_high, got {ratio_low}, {ratio_high}")
        stat = rho  # [B, T] log ratio; bounds are checked in log space
        lo, hi = math.log(ratio_low), math.log(ratio_high)
    elif metric == "k2":
        stat = 0.5 * rho.square()  # [B, T]
        lo, hi = -math.inf, threshold
    elif metric == "k3":
        stat = torch.exp(rho) - 1.0 - rho  # [B, T]
        lo, hi = -math.inf, threshold
    else:
        raise ValueError(f"rejection metric must be 'k1', 'k2' or 'k3', got {metric!r}")
    if agg == "token":
        value = stat  # [B, T]
    elif agg == "seq_sum":
        value = (stat * mask).sum(-1, keepdim=True)  # [B, 1]
    elif agg == "seq_mean":
        value = _masked_mean(stat, mask, dim=-1).unsqueeze(-1)  # [B, 1]
    else:
        value = _masked_max(stat, mask, dim=-1).unsqueeze(-1)  # [B, 1]
    keep = ((value >= lo) & (value <= hi)).to(mask.dtype).expand_as(mask)  # [B, T]
    rejected = (1.0 - keep) * mask  # [B, T]
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    metrics = {
        "rs_masked_fraction": _masked_mean(rejected, mask),
        "rs_seq_masked_fraction": _masked_mean((rejected.sum(-1) > 0).to(mask.dtype), seq_valid),
    }
    return keep, metrics


def _finish(
    inputs: CorrectionInputs,
    params: Any,
    weights: Tensor | None,
    keep: Tensor | None,
    metrics: dict[str, Tensor],
) -> CorrectionOutput:
    mode = _check_mode(params)
    mask_in = inputs.response_mask
    new_mask = mask_in if keep is None else (mask_in * keep.to(mask_in.dtype)).to(mask_in.dtype)  # [B, T]
    if weights is not None and keep is not None:
        weights = weights * keep  # [B, T]
    valid = mask_in.to(inputs.old_log_probs.dtype)  # [B, T]
    metrics = {**offpolicy_metrics(inputs.old_log_probs, inputs.rollout_log_probs, valid), **metrics}
    dropped = valid - new_mask.to(valid.dtype)  # [B, T]
    seq_valid = (valid.sum(-1) > 0).to(valid.dtype)  # [B]
    metrics["masked_fraction"] = _masked_mean(dropped, valid)
    metrics["seq_masked_fraction"] = _masked_mean((dropped.sum(-1) > 0).to(valid.dtype), seq_valid)
    if mode == "bypass":
        # old := rollout: the policy ratio against the rollout log-probs is the correction itself
        weights = None
    return CorrectionOutput(
        weights=None if weights is None else weights.detach(),
        mask=new_mask,
        metrics=_prefixed(metrics),
        mode=mode,
    )


# ---------------------------------------------------------------------------------------------
# parts
# ---------------------------------------------------------------------------------------------
def none(inputs: CorrectionInputs, params: Any) -> CorrectionOutput:
    """No correction: no weights, mask unchanged, no metrics (mode still honoured)."""
    return CorrectionOutput(weights=None, mask=inputs.response_mask, metrics={}, mode=_check_mode(params))


@torch.no_grad()
def token_is(inputs: CorrectionInputs, params: Any) -> CorrectionOutput:
    """Token-level truncated importance sampling: ``min(exp(rho_t), threshold)``."""
    mask = inputs.response_mask.to(inputs.old_log_probs.dtype)  # [B, T]
    log_ratio = inputs.old_log_probs - inputs.rollout_log_probs  # [B, T]
    weights, metrics = importance_weights(log_ratio, mask, "token", params.threshold, params.batch_normalize)
    return _finish(inputs, params, weights, None, metrics)


@torch.no_grad()
def seq_is(inputs: CorrectionInputs, params: Any) -> CorrectionOutput:
    """Sequence-level truncated importance sampling: ``min(exp(sum_t rho_t), threshold)``."""
    mask = inputs.response_mask.to(inputs.old_log_probs.dtype)  # [B, T]
    log_ratio = inputs.old_log_probs - inputs.rollout_log_probs  # [B, T]
    weights, metrics = importance_weights(
        log_ratio, mask, "sequence", params.threshold, params.batch_normalize
    )
    return _finish(inputs, params, weights, None, metrics)


@torch.no_grad()
def icepop(inputs: CorrectionInputs, params: Any) -> CorrectionOutput:
    """IcePop: mask tokens whose ratio is outside [low, high]; weight the rest by their ratio."""
    if not 0 < params.low <= params.high:
        raise ValueError(f"icepop needs 0 < low <= high, got {params.low}, {params.high}")
    mask = inputs.response_mask.to(inputs.old_log_probs.dtype)  # [B, T]
    log_ratio = inputs.old_log_probs - inputs.rollout_log_probs  # [B, T]
    keep, metrics = rejection_mask(log_ratio, mask, "k1", "token", math.inf, params.low, params.high)
    weights = None
    if params.apply_weights:
        weights, is_metrics = importance_weights(log_ratio, mask, "token", None)
        metrics.update(is_metrics)
    return _finish(inputs, params, weights, keep, metrics)


@torch.no_grad()
def rejection(inputs: CorrectionInputs, params: Any) -> CorrectionOutput:
    """Rejection sampling by a k1 / k2 / k3 statistic, optionally with truncated IS weights."""
    mask = inputs.response_mask.to(inputs.old_log_probs.dtype)  # [B, T]
    log_ratio = inputs.old_log_probs - inputs.rollout_log_probs  # [B, T]
    keep, metrics = rejection_mask(
        log_ratio, mask, params.metric, params.agg, params.threshold, params.ratio_low, params.ratio_high
    )
    weights = None
    if params.is_level != "none":
        weights, is_metrics = importance_weights(log_ratio, mask, params.is_level, params.is_threshold)
        metrics.update(is_metrics)
    return _finish(inputs, params, weights, keep, metrics)
