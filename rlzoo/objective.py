"""Per-micro-batch objectives composed from the selected parts.

A train backend calls ``objective(micro_batch, log_probs, entropy)`` for each micro-batch and
back-propagates the returned loss; the aggregation inside is bound to the **whole mini-batch's**
token / sequence counts, so gradients summed over micro-batches (and data-parallel ranks) equal
the full-batch gradient. Loss-like metrics are accumulated here the same way and read with
:meth:`PolicyObjective.summary` after the update.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlzoo.batch import Batch
from rlzoo.metrics import to_float
from rlzoo.protocols import AggContext, BoundAgg, PolicyLossInputs
from rlzoo.recipe import Selection


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


def agg_context(mini_batch: Batch, max_response_length: int | None = None) -> AggContext:
    return make_agg_context(mini_batch["response_mask"], max_response_length)


def _bind(loss_agg: Selection, ctx: AggContext) -> Any:
    fn = loss_agg.fn
    params = loss_agg.params

    def agg(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return fn(per_token, mask, ctx, params)

    return agg


class _Accumulator:
    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)  # additive (already globally normalised)
        self.means: dict[str, list[float]] = defaultdict(list)  # per micro-batch values

    def add(self, key: str, value: Any) -> None:
        f = to_float(value)
        if f is not None:
            self.sums[key] += f

    def mean(self, key: str, value: Any) -> None:
        f = to_float(value)
        if f is not None:
            self.means[key].append(f)

    def summary(self) -> dict[str, float]:
        out = dict(self.sums)
        out.update({k: sum(v) / len(v) for k, v in self.means.items() if v})
        return out


@dataclass
class PolicyObjective:
    """policy_loss ∘ loss_agg  (+ kl_coef · agg(kl(logp, ref)))  (− entropy_coeff · agg(entropy))."""

    policy_loss: Selection
    loss_agg: Selection
    ctx: AggContext
    kl_loss: Selection | None = None
    kl_coef: float = 0.0
    entropy_coeff: float = 0.0
    #: ``fn(old, rollout, mask) -> metrics`` (rollout-vs-trainer drift), used when the micro-batch
    #: has no ``old_log_probs`` (an exactly on-policy update: they are this forward's, detached);
    #: measured once over all micro-batches, in :meth:`summary`
    offpolicy_metrics: Any = None

    def __post_init__(self) -> None:
        self.agg = _bind(self.loss_agg, self.ctx)
        self.acc = _Accumulator()
        self.needs_entropy = True  # entropy is always reported as a metric; cheap next to the forward
        self._drift: list[tuple[Tensor, Tensor, Tensor]] = []  # (old, rollout, mask) per micro-batch

    def __call__(
        self, mb: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = mb["response_mask"]  # [b, T]
        old = mb.get("old_log_probs")  # [b, T]
        if old is None:  # exactly on-policy (the old-log-prob forward was skipped): pi_old = pi_theta
            old = log_probs.detach()
            if self.offpolicy_metrics is not None and "rollout_log_probs" in mb:
                self._drift.append((old, mb["rollout_log_probs"], mask))
        inputs = PolicyLossInputs(
            log_probs=log_probs,  # [b, T]
            old_log_probs=old,  # [b, T]
            advantages=mb["advantages"],  # [b, T]
            response_mask=mask,
            agg=self.agg,
            rollout_is_weights=mb.get("rollout_is_weights"),
            entropy=entropy,
        )
        out = self.policy_loss(inputs)
        loss = out.loss
        self.acc.add("actor/pg_loss", loss.detach())
        for k, v in out.metrics.items():
            self.acc.mean(f"actor/{k}", v)
        if entropy is not None:
            ent = self.agg(entropy, mask)
            self.acc.add("actor/entropy", ent.detach())
            if self.entropy_coeff:
                loss = loss - self.entropy_coeff * ent
        if self.kl_loss is not None and self.kl_coef:
            kl = self.kl_loss(log_probs, mb["ref_log_probs"])  # [b, T]
            kl_value = self.agg(kl, mask)
            self.acc.add("actor/kl_loss", kl_value.detach())
            loss = loss + self.kl_coef * kl_value
        self.acc.add("actor/loss", loss.detach())
        return loss, {}

    def summary(self) -> dict[str, float]:
        if self._drift:  # the drift of the whole update, from one call (not one per micro-batch)
            parts, self._drift = self._drift, []
            width = max(p[0].shape[-1] for p in parts)
            old, rollout, mask = (
                torch.cat([torch.nn.functional.pad(p[i], (0, width - p[i].shape[-1])) for p in parts])
                for i in range(3)
            )  # [B, T] each; padded columns are masked out
            for k, v in self.offpolicy_metrics(old, rollout, mask).items():
                self.acc.mean(k if k.startswith("rollout_corr/") else f"rollout_corr/{k}", v)
        return self.acc.summary()


@dataclass
class ValueObjective:
    """Clipped value loss for the critic, aggregated like the policy loss."""

    loss_agg: Selection
    ctx: AggContext
    cliprange_value: float = 0.5

    def __post_init__(self) -> None:
        self.agg = _bind(self.loss_agg, self.ctx)
        self.acc = _Accumulator()
        self.needs_entropy = False

    def __call__(
        self, mb: Batch, values: torch.Tensor, _unused: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        loss, metrics = value_loss(
            values, mb["values"], mb["returns"], mb["response_mask"], self.agg, self.cliprange_value
        )
        self.acc.add("critic/vf_loss", loss.detach())
        for k, v in metrics.items():
            self.acc.mean(f"critic/{k}", v)
        return loss, {}

    def summary(self) -> dict[str, float]:
        return self.acc.summary()


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
