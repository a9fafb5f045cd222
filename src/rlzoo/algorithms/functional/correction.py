"""Off-policy (rollout) corrections: the tensor code behind :mod:`rlzoo.algorithms.correction`.

Every part is ``fn(inputs: CorrectionInputs, params) -> CorrectionOutput``. With the per-token log
ratio ``rho_t = old_log_probs - rollout_log_probs`` (log of pi_train / pi_rollout):

- importance weights (detached): token ``exp(rho_t)`` or sequence ``exp(sum_t rho_t)`` (product of
  the token ratios), exponent clamped to [-20, 20], truncated above at ``threshold`` (TIS);
- IcePop: tokens whose ratio leaves [low, high] get weight 0 (they stay in the response mask, as
  verl); the kept ones are weighted by their ratio;
- rejection: chained criteria, verl's ``rollout_rs`` strings (``"token_k1,seq_mean_k3"``): per token
  or per sequence (sum / mean / max over the tokens) of k1 = -rho (kept when pi_rollout / pi_old
  lies in [lower, upper]), k2 = rho^2 / 2 or k3 = exp(rho) - 1 - rho (kept when at most the
  threshold); every criterion must keep a token;
- token veto (every part but ``none``): a response with any token ratio below
  ``token_veto_threshold`` is rejected whole (verl's ``rollout_token_veto_threshold``).

Names and metrics follow verl's ``rollout_corr_helper.py``. Metrics are detached 0-dim tensors
(no host sync here) under the ``rollout_corr/`` prefix.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from rlzoo.kernel.protocols import CorrectionInputs, CorrectionOutput

# the mismatch diagnostics (and their exponent bound) are logged by the core's policy trainer too
from rlzoo.train_kit.formulas import SAFETY_BOUND, offpolicy_metrics
from rlzoo.train_kit.formulas import masked_max as _masked_max
from rlzoo.train_kit.formulas import masked_mean as _masked_mean

from ..correction import (
    IcePopParams,
    NoCorrectionParams,
    RejectionParams,
    SeqISParams,
    TokenISParams,
    TruncatedISParams,
    parse_criteria,
)

__all__ = [
    "icepop",
    "importance_weights",
    "none",
    "rejection",
    "rejection_mask",
    "seq_is",
    "token_is",
    "token_veto",
]

MODES = ("decoupled", "bypass")
PREFIX = "rollout_corr/"


class _Mode(Protocol):
    """What every correction part reads: its ``mode``."""

    @property
    def mode(self) -> str: ...


class _Vetoed(_Mode, Protocol):
    """What :func:`_finish` reads: ``mode`` and the token veto (every part but ``none``)."""

    @property
    def token_veto_threshold(self) -> float | None: ...


def _check_mode(params: _Mode) -> str:
    mode = params.mode
    if mode not in MODES:
        raise ValueError(f"rollout_correction mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def _masked_min(x: Tensor, mask: Tensor) -> Tensor:
    out = x.masked_fill(mask <= 0, torch.inf).amin()
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


def _prefixed(metrics: dict[str, Tensor]) -> dict[str, float | Tensor]:
    return {PREFIX + k: v.detach() for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
def _is_metrics(
    weights: Tensor,
    raw: Tensor,
    unit_log_w: Tensor,
    mask: Tensor,
    level: str,
    upper: float,
    lower: float,
) -> dict[str, Tensor]:
    """verl's ``compute_is_metrics`` (names without the ``rollout_is_`` prefix added by the caller).

    ``weights`` are the applied weights (after truncation / IcePop zeroing), ``raw`` the masked
    weights before it, ``unit_log_w`` the log-weight per unit (token ``[B, T]`` or sequence
    ``[B, 1]``). mean / max / min / std / ESS are of the applied weights, clamped to
    ``[0, upper]`` for std and ESS; the fractions high / low are of the raw weights.
    """
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    log_hi, log_lo = math.log(upper), (math.log(lower) if lower > 0 else -math.inf)
    out: dict[str, Tensor] = {"mean": _masked_mean(weights, mask)}
    if level == "sequence":
        seq_log = unit_log_w.squeeze(-1)  # [B]
        out["max"] = torch.exp(_masked_max(seq_log, seq_valid).clamp(max=SAFETY_BOUND))
        out["min"] = torch.exp(-_masked_max(-seq_log, seq_valid))
        out["ratio_fraction_high"] = _masked_mean((seq_log > log_hi).to(mask.dtype), seq_valid)
        out["ratio_fraction_low"] = _masked_mean((seq_log < log_lo).to(mask.dtype), seq_valid)
    else:
        out["ratio_fraction_high"] = _masked_mean((raw > upper).to(mask.dtype), mask)
        out["ratio_fraction_low"] = _masked_mean((raw < lower).to(mask.dtype), mask)
        out["max"] = _masked_max(weights, mask)
        out["min"] = _masked_min(weights, mask)
    clamped = weights.clamp(min=0.0, max=upper)  # [B, T]
    c_mean = _masked_mean(clamped, mask)
    var = (_masked_mean(clamped.square(), mask) - c_mean.square()).clamp(min=0.0)
    out["std"] = torch.where(mask.sum() > 1, var.sqrt(), torch.zeros_like(var))
    normalized = clamped / (c_mean + 1e-8)  # [B, T]
    out["eff_sample_size"] = 1.0 / _masked_mean(normalized.square(), mask).clamp(min=1e-12)
    seq_w = _masked_mean(weights, mask, dim=-1)  # [B] per-sequence mean weight
    raw_seq_w = _masked_mean(raw, mask, dim=-1)  # [B]
    n_seq = seq_valid.sum()
    seq_mean = _masked_mean(seq_w, seq_valid)
    seq_var = _masked_mean((seq_w - seq_mean).square(), seq_valid) * n_seq / (n_seq - 1).clamp(min=1)
    out["seq_mean"] = seq_mean
    out["seq_std"] = torch.where(n_seq > 1, seq_var.sqrt(), torch.zeros_like(seq_var))
    out["seq_max"] = _masked_max(seq_w, seq_valid)
    out["seq_min"] = -_masked_max(-seq_w, seq_valid)
    out["seq_max_deviation"] = _masked_max((seq_w - 1.0).abs(), seq_valid)
    out["seq_fraction_high"] = _masked_mean((raw_seq_w > upper).to(mask.dtype), seq_valid)
    out["seq_fraction_low"] = _masked_mean((raw_seq_w < lower).to(mask.dtype), seq_valid)
    return out


@torch.no_grad()
def importance_weights(
    log_ratio: Tensor,
    mask: Tensor,
    level: str,
    threshold: float | None,
    batch_normalize: bool = False,
    lower: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IS weights ``[B, T]`` (zero on padding, detached) and their metrics (``rollout_is_*``).

    With ``lower`` None the weights are truncated above at ``threshold`` (TIS; None: no
    truncation); with ``lower`` set, weights outside ``[lower, threshold]`` are zeroed instead
    (IcePop, verl's ``rollout_is_threshold: "lower_upper"``). Metrics as verl's
    ``compute_is_metrics``, taken before batch normalisation.
    """
    if level == "token":
        unit_log_w = log_ratio  # [B, T]
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask  # [B, T]
    elif level == "sequence":
        unit_log_w = (log_ratio * mask).sum(-1, keepdim=True)  # [B, 1] log of the product of ratios
        raw = torch.exp(unit_log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * mask  # [B, T]
    else:
        raise ValueError(f"importance weight level must be 'token' or 'sequence', got {level!r}")
    upper = math.inf if threshold is None else float(threshold)
    if upper <= 0:
        raise ValueError(f"importance weight threshold must be positive, got {threshold}")
    metrics: dict[str, Tensor] = {}
    if lower is None:
        weights = raw.clamp(max=upper)  # [B, T] TIS
        lo = 1.0 / upper
    else:
        if not 0 < lower <= upper:
            raise ValueError(f"IcePop bounds need 0 < lower <= upper, got {lower}, {upper}")
        inside = (raw >= lower) & (raw <= upper)  # [B, T]
        weights = torch.where(inside, raw, torch.zeros_like(raw))  # [B, T] IcePop
        lo = lower
    metrics.update(_is_metrics(weights, raw, unit_log_w, mask, level, upper, lo))
    if lower is not None:
        metrics["oob_ratio"] = _masked_mean(((raw < lower) | (raw > upper)).to(mask.dtype), mask)
    if batch_normalize:
        norm = (
            _masked_mean(weights, mask)
            if level == "token"
            else _masked_mean(_masked_mean(weights, mask, dim=-1), (mask.sum(-1) > 0).to(mask.dtype))
        )
        metrics["batch_norm_factor"] = torch.where(norm > 1e-8, norm, torch.ones_like(norm))
        weights = torch.where(norm > 1e-8, weights / norm.clamp(min=1e-8), weights)  # [B, T]
    return weights.detach(), {f"rollout_is_{k}": v for k, v in metrics.items()}


def _rs_metrics(
    name: str, stat: Tensor, seq_stat: Tensor | None, mask: Tensor, lo: float, hi: float
) -> dict[str, Tensor]:
    """verl's ``compute_rs_metrics`` for one criterion (k1 thresholds in log space)."""
    is_k1 = name.endswith("k1")
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    seq = seq_stat if seq_stat is not None else _masked_mean(stat, mask, dim=-1)  # [B]
    lo_m = lo if is_k1 else 0.0
    out: dict[str, Tensor] = {"mean": _masked_mean(stat, mask)}
    if seq_stat is not None:
        out["max"], out["min"] = _masked_max(seq, seq_valid), -_masked_max(-seq, seq_valid)
        out["fraction_high"] = _masked_mean((seq > hi).to(mask.dtype), seq_valid)
        low = _masked_mean((seq < lo_m).to(mask.dtype), seq_valid)
    else:
        out["max"], out["min"] = _masked_max(stat, mask), _masked_min(stat, mask)
        out["fraction_high"] = _masked_mean((stat > hi).to(mask.dtype), mask)
        low = _masked_mean((stat < lo_m).to(mask.dtype), mask)
    out["fraction_low"] = low if is_k1 else torch.zeros_like(low)
    clamped = stat.clamp(min=lo_m, max=hi)  # [B, T]
    c_mean = _masked_mean(clamped, mask)
    var = (_masked_mean(clamped.square(), mask) - c_mean.square()).clamp(min=0.0)
    out["std"] = torch.where(mask.sum() > 1, var.sqrt(), torch.zeros_like(var))
    n_seq = seq_valid.sum()
    s_mean = _masked_mean(seq, seq_valid)
    s_var = _masked_mean((seq - s_mean).square(), seq_valid) * n_seq / (n_seq - 1).clamp(min=1)
    out["seq_mean"] = s_mean
    out["seq_std"] = torch.where(n_seq > 1, s_var.sqrt(), torch.zeros_like(s_var))
    out["seq_max"], out["seq_min"] = _masked_max(seq, seq_valid), -_masked_max(-seq, seq_valid)
    out["seq_max_deviation"] = _masked_max(seq.abs(), seq_valid)
    out["seq_fraction_high"] = _masked_mean((seq > hi).to(mask.dtype), seq_valid)
    if is_k1:
        out["seq_fraction_low"] = _masked_mean((seq < lo_m).to(mask.dtype), seq_valid)
    return {f"rollout_rs_{name}_{k}": v for k, v in out.items()}


@torch.no_grad()
def rejection_mask(
    log_ratio: Tensor, mask: Tensor, criteria: str, thresholds: str | float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Keep mask ``[B, T]`` (1 kept, 0 rejected) from chained k1 / k2 / k3 criteria (verl ``rollout_rs``).

    Per token ``k1 = -rho`` (the log of pi_rollout / pi_old), ``k2 = rho^2 / 2``,
    ``k3 = exp(rho) - 1 - rho``; a criterion reads them per token or per sequence (sum / mean /
    max over the valid tokens). k1 is kept inside ``[log lower, log upper]``, k2 / k3 at most
    ``upper``. A token is kept when every criterion keeps it. Metrics as verl's.
    """
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, T]
    per_token = {"k1": -rho, "k2": 0.5 * rho.square(), "k3": torch.exp(rho) - 1.0 - rho}  # [B, T] each
    keep = torch.ones_like(mask)  # [B, T]
    metrics: dict[str, Tensor] = {}
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    for name, lo, hi in parse_criteria(criteria, thresholds):
        level, _, est = name.rpartition("_")
        token_stat = per_token[est]  # [B, T]
        if est == "k1":
            lo_t, hi_t = math.log(lo), math.log(hi)
        else:
            lo_t, hi_t = -math.inf, hi
        seq_stat: Tensor | None
        if level == "token":
            seq_stat, value = None, token_stat  # [B, T]
        else:
            if level == "seq_sum":
                seq_stat = (token_stat * mask).sum(-1)  # [B]
            elif level == "seq_mean":
                seq_stat = _masked_mean(token_stat, mask, dim=-1)  # [B]
            else:
                seq_stat = _masked_max(token_stat, mask, dim=-1)  # [B]
            value = seq_stat.unsqueeze(-1).expand_as(mask)  # [B, T]
        kept = ((value >= lo_t) & (value <= hi_t)).to(mask.dtype)  # [B, T]
        keep = keep * kept
        stat_for_metrics = token_stat if seq_stat is None else value
        metrics.update(_rs_metrics(name, stat_for_metrics, seq_stat, mask, lo_t, hi_t))
        rejected = (1.0 - kept) * mask  # [B, T]
        metrics[f"rollout_rs_{name}_masked_fraction"] = _masked_mean(rejected, mask)
        metrics[f"rollout_rs_{name}_seq_masked_fraction"] = _masked_mean(
            (rejected.sum(-1) > 0).to(mask.dtype), seq_valid
        )
    rejected = (1.0 - keep) * mask  # [B, T]
    metrics["rollout_rs_masked_fraction"] = _masked_mean(rejected, mask)
    metrics["rollout_rs_seq_masked_fraction"] = _masked_mean((rejected.sum(-1) > 0).to(mask.dtype), seq_valid)
    return keep, metrics


@torch.no_grad()
def token_veto(log_ratio: Tensor, mask: Tensor, threshold: float | None) -> tuple[Tensor | None, dict]:
    """Reject a whole response when any valid token has pi_old / pi_rollout below ``threshold``.

    verl's ``rollout_token_veto_threshold`` (verl 0.5-0.6; 0.9.1 dropped the option). Returns a
    keep mask ``[B, T]`` (None when off) and ``rollout_is_veto_fraction`` (sequences vetoed) and
    ``rollout_is_catastrophic_token_fraction`` (tokens below the threshold).
    """
    if threshold is None:
        return None, {}
    if not threshold > 0:
        raise ValueError(f"token_veto_threshold must be > 0 (or None to switch it off), got {threshold}")
    bad = (log_ratio < math.log(threshold)) & (mask > 0)  # [B, T]
    vetoed = bad.any(-1, keepdim=True)  # [B, 1]
    keep = (~vetoed).to(mask.dtype).expand_as(mask)  # [B, T]
    seq_valid = (mask.sum(-1) > 0).to(mask.dtype)  # [B]
    return keep, {
        "rollout_is_veto_fraction": _masked_mean(vetoed.squeeze(-1).to(mask.dtype), seq_valid),
        "rollout_is_catastrophic_token_fraction": _masked_mean(bad.to(mask.dtype), mask),
    }


def _finish(
    inputs: CorrectionInputs,
    params: _Vetoed,
    weights: Tensor | None,
    keep: Tensor | None,
    metrics: dict[str, Tensor],
) -> CorrectionOutput:
    mode = _check_mode(params)
    mask_in = inputs.response_mask
    valid = mask_in.to(inputs.old_log_probs.dtype)  # [B, T]
    veto, veto_metrics = token_veto(
        inputs.old_log_probs - inputs.rollout_log_probs, valid, params.token_veto_threshold
    )
    metrics.update(veto_metrics)
    if veto is not None:
        keep = veto if keep is None else keep * veto  # [B, T]
    new_mask = mask_in if keep is None else (mask_in * keep.to(mask_in.dtype)).to(mask_in.dtype)  # [B, T]
    if weights is not None and keep is not None:
        weights = weights * keep  # [B, T]
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
def none(inputs: CorrectionInputs, params: NoCorrectionParams) -> CorrectionOutput:
    """No correction: no weights, mask unchanged, no metrics (mode still honoured)."""
    return CorrectionOutput(weights=None, mask=inputs.response_mask, metrics={}, mode=_check_mode(params))


def _prepare(inputs: CorrectionInputs) -> tuple[Tensor, Tensor]:
    mask = inputs.response_mask.to(inputs.old_log_probs.dtype)  # [B, T]
    return inputs.old_log_probs - inputs.rollout_log_probs, mask  # [B, T] log(pi_old / pi_rollout)


def _truncated_is(inputs: CorrectionInputs, params: TruncatedISParams, level: str) -> CorrectionOutput:
    log_ratio, mask = _prepare(inputs)
    weights, metrics = importance_weights(log_ratio, mask, level, params.threshold, params.batch_normalize)
    return _finish(inputs, params, weights, None, metrics)


@torch.no_grad()
def token_is(inputs: CorrectionInputs, params: TokenISParams) -> CorrectionOutput:
    """Token-level truncated importance sampling: ``min(exp(rho_t), threshold)``."""
    return _truncated_is(inputs, params, "token")


@torch.no_grad()
def seq_is(inputs: CorrectionInputs, params: SeqISParams) -> CorrectionOutput:
    """Sequence-level truncated importance sampling: ``min(exp(sum_t rho_t), threshold)``."""
    return _truncated_is(inputs, params, "sequence")


@torch.no_grad()
def icepop(inputs: CorrectionInputs, params: IcePopParams) -> CorrectionOutput:
    """IcePop: weight 0 for tokens whose ratio is outside [low, high], the ratio elsewhere.

    As verl (``rollout_is_threshold: "low_high"``), the response mask is left alone: zero-weight
    tokens still count in a token-mean's denominator.
    """
    log_ratio, mask = _prepare(inputs)
    weights, metrics = importance_weights(log_ratio, mask, "token", params.high, lower=params.low)
    if not params.apply_weights:
        weights = (weights > 0).to(weights.dtype)  # [B, T] 0 / 1: the gate without the ratio
    return _finish(inputs, params, weights, None, metrics)


@torch.no_grad()
def rejection(inputs: CorrectionInputs, params: RejectionParams) -> CorrectionOutput:
    """Rejection sampling by chained k1 / k2 / k3 criteria, optionally with truncated IS weights."""
    log_ratio, mask = _prepare(inputs)
    keep, metrics = rejection_mask(log_ratio, mask, params.criteria, params.thresholds)
    weights = None
    if params.is_level != "none":
        weights, is_metrics = importance_weights(log_ratio, mask, params.is_level, params.is_threshold)
        metrics.update(is_metrics)
    return _finish(inputs, params, weights, keep, metrics)
