"""Policy losses: ``fn(inputs: PolicyLossInputs, params) -> PolicyLossOutput``.

Formulas follow verl's ``verl/trainer/ppo/core_algos.py`` (``compute_policy_loss_*``) token for
token, including its log-ratio clamps; the differences are listed in docs/components/policy_loss.md.
Every loss builds a per-token loss ``[B, T]``, multiplies it by ``inputs.rollout_is_weights`` when
given, and reduces it with ``inputs.agg`` (the selected, globally normalised aggregation).

Notation: ``r = exp(log_probs - old_log_probs)`` the token ratio, ``A`` the advantages, ``m`` the
response mask. Metrics are detached scalar tensors (no host sync): ``pg_clipfrac``,
``pg_clipfrac_lower`` and ``ppo_kl`` (masked mean of ``old_log_probs - log_probs``) for every loss.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from rlzoo.kernel.protocols import PolicyLossInputs, PolicyLossOutput

from ..policy_loss import (
    CISPOParams,
    ClipBounds,
    ClipCovParams,
    DPPOKLParams,
    DPPOTVParams,
    DROParams,
    GeoMeanParams,
    GPGParams,
    GSPOParams,
    KLCovParams,
    NLLParams,
    PPOClipParams,
    ReinforceISParams,
    SAPOParams,
)

__all__ = [
    "cispo",
    "clip_cov",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "geo_mean",
    "gpg",
    "gspo",
    "kl_cov",
    "nll",
    "ppo_clip",
    "sapo",
]

#: verl clamps the token log-ratio to this range before exponentiating.
LOG_RATIO_CLAMP = 20.0
#: verl clamps GSPO's (combined) log sequence ratio from above at this value.
GSPO_LOG_RATIO_MAX = 10.0


# -- helpers --------------------------------------------------------------------------------------
def _float_mask(inputs: PolicyLossInputs) -> Tensor:
    return inputs.response_mask.to(inputs.log_probs.dtype)  # [B, T]


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """verl_F.masked_mean: sum(x * m) / (sum(m) + 1e-8), 0 for an empty mask."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() / (mask.sum() + 1e-8)


def _log_ratio(inputs: PolicyLossInputs, clamp: bool = True) -> Tensor:
    log_ratio = inputs.log_probs - inputs.old_log_probs  # [B, T]  "negative_approx_kl"
    if clamp:
        log_ratio = torch.clamp(log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    return log_ratio


def _reduce(pg_losses: Tensor, inputs: PolicyLossInputs) -> Tensor:
    if inputs.rollout_is_weights is not None:
        pg_losses = pg_losses * inputs.rollout_is_weights.detach()  # [B, T]
    return inputs.agg(pg_losses, inputs.response_mask)


def _metrics(clipfrac: Tensor | float, kl: Tensor, clipfrac_lower: Tensor | float, **extra: Any) -> dict:
    def d(x: Tensor | float) -> Tensor:
        return x.detach() if isinstance(x, Tensor) else torch.tensor(float(x), device=kl.device)

    out = {"pg_clipfrac": d(clipfrac), "ppo_kl": d(kl), "pg_clipfrac_lower": d(clipfrac_lower)}
    out.update({k: d(v) for k, v in extra.items()})
    return out


class _TruncatedRatio(Protocol):
    """What :func:`_dppo` reads: the IS-ratio truncation of dppo_tv and dppo_kl."""

    @property
    def clip_ratio_c(self) -> float: ...


def _clip_bounds(params: ClipBounds) -> tuple[float, float]:
    return float(params.clip_ratio_low), float(params.clip_ratio_high)


# -- PPO family -----------------------------------------------------------------------------------
def ppo_clip(inputs: PolicyLossInputs, params: PPOClipParams) -> PolicyLossOutput:
    """PPO clipped surrogate with clip-higher and dual clip (verl ``vanilla``).

    l1 = -A r, l2 = -A clip(r, 1 - eps_low, 1 + eps_high), l = max(l1, l2);
    for A < 0 additionally l = min(l, -A c) (dual clip, c = clip_ratio_c > 1).
    """
    low, high = _clip_bounds(params)
    c = float(params.clip_ratio_c)
    mask = _float_mask(inputs)
    adv = inputs.advantages  # [B, T]

    log_ratio = _log_ratio(inputs)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    ppo_kl = _masked_mean(-log_ratio, mask)

    pg_losses1 = -adv * ratio  # [B, T]
    pg_losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)  # [B, T]
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # [B, T]
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask)

    pg_losses3 = -adv * c  # [B, T]
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)  # [B, T]
    dual = torch.gt(clip_pg_losses1, pg_losses3) & (adv < 0)  # [B, T]
    pg_clipfrac_lower = _masked_mean(dual.to(mask.dtype), mask)

    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)  # [B, T]
    loss = _reduce(pg_losses, inputs)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower))


def gspo(inputs: PolicyLossInputs, params: GSPOParams) -> PolicyLossOutput:
    """GSPO (https://arxiv.org/abs/2507.18071), token form with a sequence-level ratio.

    s_i = exp(mean_t log(pi / pi_old)) (geometric mean of the token ratios of response i);
    s_it = sg[s_i] * pi_t / sg[pi_t] (equal to s_i in value, gradient s_i * grad log pi_t);
    l = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high)). The paper aggregates with
    seq-mean-token-mean, under which this equals sequence-level GSPO.
    """
    low, high = _clip_bounds(params)
    mask = _float_mask(inputs)
    adv = inputs.advantages  # [B, T]
    log_probs = inputs.log_probs  # [B, T]

    log_ratio = _log_ratio(inputs, clamp=False)  # [B, T]  (verl does not clamp here)
    seq_len = mask.sum(dim=-1).clamp(min=1)  # [B]
    masked_log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))  # [B, T]
    log_seq_ratio = masked_log_ratio.sum(dim=-1) / seq_len  # [B]

    log_s = log_probs - log_probs.detach() + log_seq_ratio.detach().unsqueeze(-1)  # [B, T]
    log_s = torch.clamp(log_s, max=GSPO_LOG_RATIO_MAX)
    seq_ratio = torch.exp(log_s)  # [B, T]

    pg_losses1 = -adv * seq_ratio  # [B, T]
    pg_losses2 = -adv * torch.clamp(seq_ratio, 1 - low, 1 + high)  # [B, T]
    pg_losses = torch.maximum(pg_losses1, pg_losses2)  # [B, T]
    loss = _reduce(pg_losses, inputs)

    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask)
    ppo_kl = _masked_mean(-log_ratio, mask)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, 0.0))


def cispo(inputs: PolicyLossInputs, params: CISPOParams) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the IS weight, not the update.

    l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi. Every token keeps a gradient.
    """
    low, high = _clip_bounds(params)
    mask = _float_mask(inputs)
    log_ratio = _log_ratio(inputs)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    ppo_kl = _masked_mean(-log_ratio, mask)

    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)  # [B, T]
    pg_losses = -clipped_ratio.detach() * inputs.advantages * inputs.log_probs  # [B, T]
    pg_clipfrac = _masked_mean((ratio != clipped_ratio).to(mask.dtype), mask)
    loss = _reduce(pg_losses, inputs)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, 0.0))


def sapo(inputs: PolicyLossInputs, params: SAPOParams) -> PolicyLossOutput:
    """SAPO (https://arxiv.org/abs/2511.20347): a soft sigmoid gate instead of a hard clip.

    f(r; tau) = (4 / tau) sigmoid(tau (r - 1)), tau = tau_pos if A > 0 else tau_neg;
    l = -f(r) A. The gradient is A r sech^2(tau (r - 1) / 2) grad log pi: 1 at r = 1, decaying
    smoothly off-policy.
    """
    mask = _float_mask(inputs)
    adv = inputs.advantages  # [B, T]
    log_ratio = _log_ratio(inputs)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]

    tau_pos = torch.as_tensor(params.tau_pos, dtype=adv.dtype, device=adv.device)
    tau_neg = torch.as_tensor(params.tau_neg, dtype=adv.dtype, device=adv.device)
    taus = torch.where(adv > 0, tau_pos, tau_neg)  # [B, T]
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)  # [B, T]
    pg_losses = -gates * adv  # [B, T]
    loss = _reduce(pg_losses, inputs)
    return PolicyLossOutput(loss, _metrics(0.0, _masked_mean(-log_ratio, mask), 0.0))


def gpg(inputs: PolicyLossInputs, params: GPGParams) -> PolicyLossOutput:
    """GPG (https://arxiv.org/abs/2504.02546): plain policy gradient, l = -A log pi (no ratio)."""
    mask = _float_mask(inputs)
    pg_losses = -inputs.log_probs * inputs.advantages  # [B, T]
    loss = _reduce(pg_losses, inputs)
    ppo_kl = _masked_mean(-(inputs.log_probs - inputs.old_log_probs), mask)
    return PolicyLossOutput(loss, _metrics(0.0, ppo_kl, 0.0))


def nll(inputs: PolicyLossInputs, params: NLLParams) -> PolicyLossOutput:
    """Supervised fine-tuning: l = -log pi on every trained token (advantages not read).

    With ``token-mean`` the loss is sum_t m_t (-log pi_t) / sum_t m_t over the mini-batch, TRL's
    ``SFTTrainer`` loss; ``ppo_kl`` is reported as for every loss (0 on-policy).
    """
    mask = _float_mask(inputs)
    pg_losses = -inputs.log_probs  # [B, T]
    loss = _reduce(pg_losses, inputs)
    ppo_kl = _masked_mean(-(inputs.log_probs - inputs.old_log_probs), mask)
    return PolicyLossOutput(loss, _metrics(0.0, ppo_kl, 0.0, nll=_masked_mean(pg_losses.detach(), mask)))


def reinforce_is(inputs: PolicyLossInputs, params: ReinforceISParams) -> PolicyLossOutput:
    """REINFORCE with truncated IS weights (verl's bypass ``loss_type: reinforce``): l = -A w log pi,
    ``w`` detached, taken against ``old_log_probs`` (the rollout's in bypass mode) at this forward."""
    from .correction import importance_weights

    mask = _float_mask(inputs)
    extra: dict[str, Any] = {}
    if params.is_level == "none":
        pg_losses = -inputs.advantages * inputs.log_probs  # [B, T]
    else:
        w, is_metrics = importance_weights(
            inputs.log_probs.detach() - inputs.old_log_probs,
            mask,
            params.is_level,
            params.threshold,
            params.batch_normalize,
        )
        pg_losses = -inputs.advantages * inputs.log_probs * w  # [B, T]
        extra = dict(is_metrics)
    loss = _reduce(pg_losses, inputs)
    ppo_kl = _masked_mean(-(inputs.log_probs - inputs.old_log_probs), mask)
    return PolicyLossOutput(loss, _metrics(0.0, ppo_kl, 0.0, **extra))


def dro(inputs: PolicyLossInputs, params: DROParams) -> PolicyLossOutput:
    """DRO (verl ``dro``): policy gradient with a quadratic log-ratio penalty, no clip.

    l = -(A log pi - beta / 2 (log pi - log pi_old)^2); the log-ratio is not clamped (as verl).
    """
    mask = _float_mask(inputs)
    log_ratio = _log_ratio(inputs, clamp=False)  # [B, T]
    pg_losses = -(inputs.log_probs * inputs.advantages - 0.5 * float(params.beta) * log_ratio.square())
    loss = _reduce(pg_losses, inputs)
    return PolicyLossOutput(loss, _metrics(0.0, _masked_mean(-log_ratio, mask), 0.0))


def geo_mean(inputs: PolicyLossInputs, params: GeoMeanParams) -> PolicyLossOutput:
    """GMPO (https://arxiv.org/abs/2507.20673): geometric mean of token-clipped ratios.

    d_t = log r_t (not clamped, as in verl); d'_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low,
    eps_high)); R_i = exp(mean_t d'_t); A_i = mean_t A_t; sequence loss L_i = -A_i R_i. The
    per-token loss is L_i on every valid token of response i, so seq-mean-token-mean (the
    paper's, and verl's, mean over sequences) returns mean_i L_i. Rollout IS weights are reduced
    to one weight per sequence by their geometric mean, as verl does.
    """
    low, high = _clip_bounds(params)
    mask = _float_mask(inputs)
    adv = inputs.advantages  # [B, T]
    log_ratio = _log_ratio(inputs, clamp=False)  # [B, T]
    ppo_kl = _masked_mean(-log_ratio, mask)

    sgn = torch.sign(adv)  # [B, T]
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)  # [B, T]
    log_ratio_min = sgn * torch.minimum(sgn * log_ratio, sgn * log_ratio_clamped)  # [B, T]

    valid = mask.bool()
    seq_len = mask.sum(dim=-1)  # [B]
    zero = torch.zeros_like(log_ratio_min)
    seq_ratio = torch.exp(torch.where(valid, log_ratio_min, zero).sum(dim=-1) / (seq_len + 1e-8))  # [B]
    seq_adv = torch.where(valid, adv, torch.zeros_like(adv)).sum(dim=-1) / (seq_len + 1e-8)  # [B]
    seq_losses = -seq_adv * seq_ratio  # [B]

    if inputs.rollout_is_weights is not None:
        log_w = torch.log(inputs.rollout_is_weights.detach() + 1e-10)  # [B, T]
        seq_w = torch.exp(torch.where(valid, log_w, torch.zeros_like(log_w)).sum(dim=-1) / (seq_len + 1e-8))
        seq_losses = seq_losses * seq_w  # [B]

    pg_losses = seq_losses.unsqueeze(-1).expand_as(adv)  # [B, T]
    loss = inputs.agg(pg_losses, inputs.response_mask)

    clipped = torch.ne(log_ratio, log_ratio_clamped)  # [B, T]
    pg_clipfrac = _masked_mean((clipped & (adv > 0)).to(mask.dtype), mask)
    pg_clipfrac_lower = _masked_mean((clipped & (adv < 0)).to(mask.dtype), mask)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower))


# -- DPPO -----------------------------------------------------------------------------------------
def _dppo(
    inputs: PolicyLossInputs, params: _TruncatedRatio, valid_pos: Tensor, valid_neg: Tensor
) -> PolicyLossOutput:
    mask = _float_mask(inputs)
    adv = inputs.advantages  # [B, T]
    log_ratio = _log_ratio(inputs)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    ppo_kl = _masked_mean(-log_ratio, mask)

    c = float(params.clip_ratio_c)
    truncated_ratio = torch.clamp(ratio, max=c).detach()  # [B, T]  TIS weight, no gradient
    valid = torch.where(adv > 0, valid_pos, valid_neg).detach().to(adv.dtype)  # [B, T]
    pg_losses = -adv * truncated_ratio * inputs.log_probs * valid  # [B, T]
    loss = _reduce(pg_losses, inputs)

    pg_clipfrac = _masked_mean(1.0 - valid, mask)
    pg_clipfrac_lower = _masked_mean((ratio > c).to(adv.dtype) * valid, mask)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower))


def dppo_tv(inputs: PolicyLossInputs, params: DPPOTVParams) -> PolicyLossOutput:
    """DPPO-Binary-TV (https://arxiv.org/abs/2602.04879): mask tokens by probability change.

    l = -A sg[min(r, c)] log pi * keep, keep = (p - p_old <= delta_high) for A > 0 and
    (p - p_old >= -delta_low) otherwise, with p = exp(log pi).
    """
    prob = torch.exp(inputs.log_probs)  # [B, T]
    old_prob = torch.exp(inputs.old_log_probs)  # [B, T]
    valid_pos = (prob - old_prob) <= float(params.clip_ratio_high)
    valid_neg = (prob - old_prob) >= -float(params.clip_ratio_low)
    return _dppo(inputs, params, valid_pos, valid_neg)


def dppo_kl(inputs: PolicyLossInputs, params: DPPOKLParams) -> PolicyLossOutput:
    """DPPO-Binary-KL (https://arxiv.org/abs/2602.04879): mask tokens by binary KL.

    KL_b = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)) (1e-8 guarded);
    keep = (KL_b <= delta_high or p <= p_old) for A > 0, (KL_b <= delta_low or p >= p_old)
    otherwise; l = -A sg[min(r, c)] log pi * keep.
    """
    log_probs, old_log_probs = inputs.log_probs, inputs.old_log_probs
    prob = torch.exp(log_probs)  # [B, T]
    old_prob = torch.exp(old_log_probs)  # [B, T]
    binary_kl = old_prob * (old_log_probs - log_probs) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )  # [B, T]
    valid_pos = (binary_kl <= float(params.clip_ratio_high)) | (prob <= old_prob)
    valid_neg = (binary_kl <= float(params.clip_ratio_low)) | (prob >= old_prob)
    return _dppo(inputs, params, valid_pos, valid_neg)


# -- covariance-based (Entropy Mechanism of RL, https://arxiv.org/abs/2505.22617) ------------------
def clip_cov(inputs: PolicyLossInputs, params: ClipCovParams) -> PolicyLossOutput:
    """Clip-Cov: PPO clip, plus a random few high-covariance tokens get no gradient at all.

    cov_t = (A_t - mean A) (log pi_t - mean log pi) over valid tokens; among valid, not already
    clipped tokens with lb < cov_t < ub, ``max(1, int(clip_cov_ratio * N))`` are picked uniformly
    at random (N: valid tokens of this micro-batch) and their loss is multiplied by 0.
    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) * corr (no dual clip, no log-ratio clamp).
    """
    low, high = _clip_bounds(params)
    mask = _float_mask(inputs)
    valid = mask.bool()
    adv, log_probs = inputs.advantages, inputs.log_probs  # [B, T]

    log_ratio = _log_ratio(inputs, clamp=False)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    ppo_kl = _masked_mean(-log_ratio, mask)

    pg_losses1 = -adv * ratio  # [B, T]
    pg_losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)  # [B, T]
    clip_by_origin = (pg_losses2 > pg_losses1) & valid  # [B, T]

    with torch.no_grad():
        cov = (adv - _masked_mean(adv, mask)) * (log_probs - _masked_mean(log_probs, mask))  # [B, T]
        candidate = valid & ~clip_by_origin & (cov < params.clip_cov_ub) & (cov > params.clip_cov_lb)
        clip_num = max(int(params.clip_cov_ratio * int(valid.sum().item())), 1)
        # a uniformly random subset of min(clip_num, #candidates) candidates (verl: randperm)
        score = torch.where(candidate, torch.rand_like(cov), torch.full_like(cov, -1.0)).flatten()
        k = min(clip_num, int(candidate.sum().item()))
        corr = torch.ones_like(adv).flatten()  # [B * T]
        if k > 0:
            corr[torch.topk(score, k).indices] = 0.0
        corr = corr.view_as(adv)  # [B, T]

    pg_clipfrac = _masked_mean((corr == 0).to(mask.dtype), mask)
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr  # [B, T]
    loss = _reduce(pg_losses, inputs)
    return PolicyLossOutput(loss, _metrics(pg_clipfrac, ppo_kl, 0.0))


def kl_cov(inputs: PolicyLossInputs, params: KLCovParams) -> PolicyLossOutput:
    """KL-Cov: no clip; the top ``kl_cov_ratio`` fraction of tokens by covariance get a KL penalty.

    cov_t = (A_t - mean A) (log pi_t - mean log pi) over valid tokens; the
    ``max(1, int(kl_cov_ratio * N))`` largest get l = -A r + k |log r|, the rest l = -A r.
    """
    mask = _float_mask(inputs)
    valid = mask.bool()
    adv, log_probs = inputs.advantages, inputs.log_probs  # [B, T]

    log_ratio = _log_ratio(inputs, clamp=False)  # [B, T]
    abs_kl = log_ratio.abs()  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    pg_losses1 = -adv * ratio  # [B, T]
    pg_losses_kl = pg_losses1 + params.ppo_kl_coef * abs_kl  # [B, T]

    with torch.no_grad():
        n_valid = int(valid.sum().item())
        selected = torch.zeros_like(valid)  # [B, T] bool
        if n_valid > 0:
            cov = (adv - _masked_mean(adv, mask)) * (log_probs - _masked_mean(log_probs, mask))  # [B, T]
            cov = torch.where(valid, cov, torch.full_like(cov, -float("inf"))).flatten()
            k = min(max(1, int(n_valid * params.kl_cov_ratio)), n_valid)
            selected = selected.flatten()
            selected[torch.topk(cov, k).indices] = True
            selected = selected.view_as(valid)

    pg_losses = torch.where(selected, pg_losses_kl, pg_losses1)  # [B, T]
    loss = _reduce(pg_losses, inputs)
    ppo_kl = _masked_mean(-log_ratio, mask)
    return PolicyLossOutput(
        loss,
        _metrics(
            0.0,
            ppo_kl,
            0.0,
            ppo_kl_abs=_masked_mean(abs_kl, mask),
            kl_cov_frac=_masked_mean(selected.to(mask.dtype), mask),
        ),
    )
