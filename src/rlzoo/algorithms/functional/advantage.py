"""Advantage estimators: the tensor code behind :mod:`rlzoo.algorithms.advantage`.

Every estimator is ``fn(inputs: AdvantageInputs, params) -> AdvantageOutput`` and matches verl's
``verl/trainer/ppo/core_algos.py`` on every unmasked position, edge cases included (a group of one,
all-equal rewards, length-1 responses). Two things differ on purpose, both only where verl's output
is undefined or arbitrary (see ``docs/components/advantage.md``):

- advantages (and returns) are exactly zero where ``response_mask`` is 0;
- whitening a batch with fewer than two valid tokens, or OPO on a group whose lengths are all
  zero, gives 0 where verl raises or returns NaN.

Group statistics use ``torch.unique(return_inverse=True)`` and segment sums (``index_add_``,
``scatter_reduce_``): no Python loop over samples or groups, and no ``(groups n)`` reshape
either, since group ids are arbitrary and groups may be uneven (filtered, partial or merged
batches). GAE and REINFORCE++ loop over the time axis only (a linear recurrence with resets), on
contiguous time-major ``[T, B]`` slices.

Shapes: ``B`` responses, ``T`` response tokens, ``G`` distinct group ids.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from rlzoo.kernel.protocols import AdvantageInputs, AdvantageOutput

from ..advantage import (
    GAEParams,
    GDPOParams,
    GPGParams,
    GRPOParams,
    GRPOPassKParams,
    OPOParams,
    OptimalTokenBaselineParams,
    ReinforcePlusPlusBaselineParams,
    ReinforcePlusPlusParams,
    ReMaxParams,
    RLOOParams,
    TIROptimalTokenBaselineParams,
    TokenGRPOParams,
    TurnGRPOParams,
)

__all__ = [
    "gae",
    "gdpo",
    "gpg",
    "group_index",
    "grpo",
    "grpo_passk",
    "masked_whiten",
    "opo",
    "optimal_token_baseline",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "tir_optimal_token_baseline",
    "token_grpo",
    "turn_grpo",
]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """verl's ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)`` over the masked entries.

    ``var`` is Bessel-corrected (``n / (n - 1)``). With fewer than two valid entries the variance
    is taken as 0 (verl raises); the centred values are then 0 at the valid entry.
    """
    mask = mask.to(values.dtype)  # [B, T]
    n = mask.sum()  # []
    mean = (values * mask).sum() / n.clamp(min=1)  # []
    centered = values - mean  # [B, T]
    var = (centered.square() * mask).sum() / (n - 1).clamp(min=1)  # [] (unbiased)
    whitened = centered * torch.rsqrt(var + 1e-8)  # [B, T]
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def _needed(x: Tensor | None, name: str, what: str) -> Tensor:
    """``x``, or the error that says which input (and which capability) the estimator ``name`` needs."""
    if x is None:
        raise ValueError(f"advantage {name!r} needs {what}, got None")
    return x


def group_index(group_ids: Tensor | None, name: str) -> tuple[Tensor, int]:
    """Map arbitrary group ids ``[B]`` to dense indices ``0..G-1``; returns ``(inverse [B], G)``."""
    group_ids = _needed(group_ids, name, "group_ids (capability needs_group)")
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [B]
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    return inverse, num_groups


def _segment_sum(x: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, x)  # [G]


def _group_stats(scores: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group ``count, mean, std`` (std unbiased, like ``torch.std``; 0 for a group of one)."""
    count = torch.bincount(inverse, minlength=num_groups).to(scores.dtype)  # [G]
    mean = _segment_sum(scores, inverse, num_groups) / count  # [G]
    sq = _segment_sum((scores - mean[inverse]).square(), inverse, num_groups)  # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # [G]
    return count, mean, std


def _group_normalized(
    scores: Tensor, inverse: Tensor, num_groups: int, norm_by_std: bool, epsilon: float
) -> Tensor:
    """GRPO's ``(r - mean_g) / (std_g + eps)`` ``[B]`` (``r - mean_g`` without ``norm_by_std``).

    As verl, a group of one gets mean 0 and std 1.
    """
    count, mean, std = _group_stats(scores, inverse, num_groups)  # [G]
    single = count == 1  # [G]
    mean = torch.where(single, torch.zeros_like(mean), mean)  # [G]
    std = torch.where(single, torch.ones_like(std), std)  # [G]
    adv = scores - mean[inverse]  # [B]
    if norm_by_std:
        adv = adv / (std[inverse] + epsilon)  # [B]
    return adv


def _token_rewards(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """``(token_level_rewards, response_mask as their dtype)``, both ``[B, T]``."""
    rewards = inputs.token_level_rewards  # [B, T]
    return rewards, inputs.response_mask.to(rewards.dtype)  # [B, T]


def _reward_to_go(rewards: Tensor, mask: Tensor) -> Tensor:
    """``G_t = sum_{s >= t} r_s m_s`` ``[B, T]`` (undiscounted)."""
    return (rewards * mask).flip(-1).cumsum(-1).flip(-1)  # [B, T]


def _outcome_scores(inputs: AdvantageInputs) -> Tensor:
    # The reward of a response: its token-level rewards summed over T (verl sums over all T too;
    # the reward manager puts the outcome on the last valid token and zeros elsewhere).
    return inputs.token_level_rewards.sum(dim=-1)  # [B]


def _broadcast(scores: Tensor, mask: Tensor) -> AdvantageOutput:
    adv = scores.unsqueeze(-1) * mask.to(scores.dtype)  # [B, T]
    return AdvantageOutput(advantages=adv, returns=adv)


# ---------------------------------------------------------------------------------------------
# critic-based
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def gae(inputs: AdvantageInputs, params: GAEParams) -> AdvantageOutput:
    """Generalized Advantage Estimation (verl ``compute_gae_advantage_return``)."""
    rewards, mask = _token_rewards(inputs)  # [B, T]
    values = _needed(inputs.values, "gae", "values (capability needs_critic)").to(rewards.dtype)  # [B, T]
    gamma, lam = float(params.gamma), float(params.lam)
    # time-major, so each step of the backward recurrence reads one contiguous row
    r_t, v_t, m_t = (rearrange(x, "b t -> t b").contiguous() for x in (rewards, values, mask))  # [T, B]
    adv_t = torch.empty_like(r_t)  # [T, B]
    nextvalues = torch.zeros_like(r_t[0])  # [B]
    lastgaelam = torch.zeros_like(r_t[0])  # [B]
    for t in range(r_t.shape[0] - 1, -1, -1):
        m, one_minus_m = m_t[t], 1.0 - m_t[t]  # [B]
        delta = r_t[t] + gamma * nextvalues - v_t[t]  # [B]
        new = delta + gamma * lam * lastgaelam  # [B]
        # masked (e.g. observation) tokens carry the next value and the running estimate through
        nextvalues = v_t[t] * m + one_minus_m * nextvalues  # [B]
        lastgaelam = new * m + one_minus_m * lastgaelam  # [B]
        adv_t[t] = lastgaelam
    advantages = rearrange(adv_t, "t b -> b t")  # [B, T]
    returns = (advantages + values) * mask  # [B, T]
    if params.whiten:
        advantages = masked_whiten(advantages, mask)  # [B, T]
    return AdvantageOutput(advantages=advantages * mask, returns=returns)


# ---------------------------------------------------------------------------------------------
# group-relative (outcome reward)
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def grpo(inputs: AdvantageInputs, params: GRPOParams) -> AdvantageOutput:
    """GRPO (verl ``compute_grpo_outcome_advantage``): ``(r - mean_g) / (std_g + eps)``."""
    scores = _outcome_scores(inputs)  # [B]
    inverse, num_groups = group_index(inputs.group_ids, "grpo")
    adv = _group_normalized(scores, inverse, num_groups, params.norm_by_std, params.epsilon)  # [B]
    return _broadcast(adv, inputs.response_mask)


def turn_index(inputs: AdvantageInputs) -> Tensor:
    """``[B, T]`` long: each response token's model turn, -1 where the mask is 0.

    ``inputs.turn_ids`` when the batch has multi-turn trajectories; otherwise the maximal runs of
    unmasked tokens are the turns (a single-turn response is one run: turn 0).
    """
    mask = inputs.response_mask.bool()  # [B, T]
    if inputs.turn_ids is not None:
        return torch.where(mask, inputs.turn_ids.to(torch.long), -1)  # [B, T]
    prev = torch.nn.functional.pad(mask[:, :-1], (1, 0))  # [B, T] mask at t - 1
    starts = (mask & ~prev).to(torch.long)  # [B, T] 1 where a run begins
    return torch.where(mask, starts.cumsum(-1) - 1, -1)  # [B, T]


@torch.no_grad()
def turn_grpo(inputs: AdvantageInputs, params: TurnGRPOParams) -> AdvantageOutput:
    """GRPO on turn-level returns: ``(G_ik - mean_g(G_0)) / (std_g(G_0) + eps)`` on turn k's tokens.

    ``r_ik`` sums the token rewards of turn ``k`` (unmasked tokens only), ``G_ik = sum_{j >= k}
    gamma^(j - k) r_ij``; the group baseline is over the trajectories' returns ``G_i0``.
    """
    rewards = inputs.token_level_rewards  # [B, T]
    mask = inputs.response_mask.to(rewards.dtype)  # [B, T]
    turn = turn_index(inputs)  # [B, T]
    B = rewards.shape[0]
    K = max(int(turn.max().item()) + 1 if turn.numel() else 0, 1)
    slot = turn.clamp(min=0)  # [B, T]
    r = torch.zeros(B, K, dtype=rewards.dtype, device=rewards.device)  # [B, K]
    r.scatter_add_(1, slot, rewards * mask)  # [B, K] per-turn rewards
    G = torch.zeros_like(r)  # [B, K]
    acc = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)  # [B]
    for k in range(K - 1, -1, -1):  # reward-to-go over turns
        acc = r[:, k] + params.gamma * acc
        G[:, k] = acc
    scores = G[:, 0]  # [B] the trajectory's discounted return
    inverse, num_groups = group_index(inputs.group_ids, "turn_grpo")
    count, mean, std = _group_stats(scores, inverse, num_groups)  # [G]
    single = count == 1  # [G] as grpo: a group of one has mean 0 and std 1
    mean = torch.where(single, torch.zeros_like(mean), mean)[inverse]  # [B]
    std = torch.where(single, torch.ones_like(std), std)[inverse]  # [B]
    adv_turn = G - mean.unsqueeze(-1)  # [B, K]
    if params.norm_by_std:
        adv_turn = adv_turn / (std.unsqueeze(-1) + params.epsilon)  # [B, K]
    adv = torch.gather(adv_turn, 1, slot) * mask  # [B, T]
    returns = torch.gather(G, 1, slot) * mask  # [B, T]
    return AdvantageOutput(advantages=adv, returns=returns)


@torch.no_grad()
def token_grpo(inputs: AdvantageInputs, params: TokenGRPOParams) -> AdvantageOutput:
    """Per-token GRPO: each token's reward normalized against the group's rewards at the same
    place (turn, index in the turn), then the discounted reward-to-go over trained tokens."""
    rewards, mask = _token_rewards(inputs)  # [B, T]
    B, T = rewards.shape
    turn = turn_index(inputs)  # [B, T] -1 off the trained tokens
    valid = turn >= 0  # [B, T]
    pos = torch.arange(T, device=rewards.device).expand(B, T)  # [B, T]
    prev_turn = torch.nn.functional.pad(turn[:, :-1], (1, 0), value=-1)  # [B, T]
    starts = valid & (turn != prev_turn)  # [B, T] first token of a turn
    start_pos = torch.where(starts, pos, 0).cummax(-1).values  # [B, T] where the token's turn began
    place = turn.clamp(min=0) * T + (pos - start_pos)  # [B, T] (turn, index in the turn)
    inverse, _ = group_index(inputs.group_ids, "token_grpo")  # [B]
    key = inverse.unsqueeze(-1) * (int(place.max().item()) + 1 if place.numel() else 1) + place  # [B, T]
    _, slot = torch.unique(key[valid], return_inverse=True)  # [N] dense index of (group, place)
    n_slots = int(slot.max().item()) + 1 if slot.numel() else 0
    r = rewards[valid]  # [N]
    _, mean, std = _group_stats(r, slot, n_slots)  # [S]
    norm = r - mean[slot]  # [N] (0 where the place has one sample)
    if params.norm_by_std:  # a place whose rewards are all equal stays 0 (even with epsilon 0)
        sd = std[slot]  # [N]
        norm = torch.where(sd > 0, norm / (sd + params.epsilon), torch.zeros_like(norm))  # [N]
    n = torch.zeros_like(rewards)  # [B, T]
    n[valid] = norm
    gamma = float(params.gamma)
    n_t, m_t = (rearrange(x, "b t -> t b").contiguous() for x in (n, mask))  # [T, B]
    adv_t = torch.zeros_like(n_t)  # [T, B]
    running = torch.zeros_like(n_t[0])  # [B]
    for t in range(T - 1, -1, -1):  # observation tokens (mask 0) carry the running sum through
        m = m_t[t]  # [B]
        new = n_t[t] + gamma * running  # [B]
        adv_t[t] = new * m
        running = new * m + (1.0 - m) * running  # [B]
    adv = rearrange(adv_t, "t b -> b t")  # [B, T]
    return AdvantageOutput(advantages=adv, returns=adv)


@torch.no_grad()
def rloo(inputs: AdvantageInputs, params: RLOOParams) -> AdvantageOutput:
    """RLOO (verl ``compute_rloo_outcome_advantage``): ``r - mean of the other n-1 rewards``."""
    scores = _outcome_scores(inputs)  # [B]
    inverse, num_groups = group_index(inputs.group_ids, "rloo")
    count, mean, _ = _group_stats(scores, inverse, num_groups)  # [G]
    n = count[inverse]  # [B]
    scale = n / (n - 1).clamp(min=1)  # [B]  n / (n - 1)
    loo = scores * scale - mean[inverse] * scale  # [B]  == r - (sum - r) / (n - 1)
    adv = torch.where(n > 1, loo, scores)  # [B] verl leaves a group of one unchanged
    return _broadcast(adv, inputs.response_mask)


@torch.no_grad()
def opo(inputs: AdvantageInputs, params: OPOParams) -> AdvantageOutput:
    """OPO (verl ``compute_opo_outcome_advantage``): length-weighted group baseline."""
    scores = _outcome_scores(inputs)  # [B]
    lengths = inputs.response_mask.to(scores.dtype).sum(dim=-1)  # [B]
    inverse, num_groups = group_index(inputs.group_ids, "opo")
    count = torch.bincount(inverse, minlength=num_groups)  # [G]
    num = _segment_sum(lengths * scores, inverse, num_groups)  # [G]
    den = _segment_sum(lengths, inverse, num_groups)  # [G]
    baseline = torch.where(den > 0, num / den.clamp(min=torch.finfo(den.dtype).tiny), 0.0)  # [G]
    baseline = torch.where(count == 1, torch.zeros_like(baseline), baseline)  # [G]
    return _broadcast(scores - baseline[inverse], inputs.response_mask)


@torch.no_grad()
def gpg(inputs: AdvantageInputs, params: GPGParams) -> AdvantageOutput:
    """GPG (verl ``compute_gpg_outcome_advantage``): ``alpha * (r - mean_g) / f_norm``."""
    scores = _outcome_scores(inputs)  # [B]
    inverse, num_groups = group_index(inputs.group_ids, "gpg")
    count, mean, _ = _group_stats(scores, inverse, num_groups)  # [G]
    mean = torch.where(count == 1, torch.zeros_like(mean), mean)  # [G]
    # alpha = B / (number of responses with a non-zero reward), at least 1 in the denominator
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)  # []
    adv = alpha * (scores - mean[inverse]) / params.f_norm  # [B]
    return _broadcast(adv, inputs.response_mask)


@torch.no_grad()
def grpo_passk(inputs: AdvantageInputs, params: GRPOPassKParams) -> AdvantageOutput:
    """Pass@k GRPO (verl ``compute_grpo_passk_outcome_advantage``): only the best response
    of each group gets ``r_max - r_second``, divided by ``std_g + eps`` when ``norm_by_std``."""
    scores = _outcome_scores(inputs)  # [B]
    inverse, num_groups = group_index(inputs.group_ids, "grpo_passk")
    count, _, std = _group_stats(scores, inverse, num_groups)  # [G]
    if num_groups and int(count.min().item()) < 2:
        raise ValueError("grpo_passk needs at least 2 responses per group")
    b = scores.shape[0]
    neg_inf = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    r_max = neg_inf.scatter_reduce(0, inverse, scores, "amax")  # [G]
    arange = torch.arange(b, device=scores.device)  # [B]
    cand = torch.where(scores == r_max[inverse], arange, b)  # [B]
    first = torch.full((num_groups,), b, dtype=torch.long, device=scores.device)
    first = first.scatter_reduce(0, inverse, cand, "amin")  # [G] lowest index holding the max
    is_best = arange == first[inverse]  # [B]
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)  # [B]
    r_second = neg_inf.scatter_reduce(0, inverse, others, "amax")  # [G]
    gap = r_max - r_second  # [G]
    if params.norm_by_std:
        gap = gap / (std + params.epsilon)  # [G]
    adv = torch.where(is_best, gap[inverse], torch.zeros_like(scores))  # [B]
    return _broadcast(adv, inputs.response_mask)


# ---------------------------------------------------------------------------------------------
# batch-normalised REINFORCE family
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs, params: ReinforcePlusPlusParams) -> AdvantageOutput:
    """REINFORCE++ (verl ``compute_reinforce_plus_plus_outcome_advantage``)."""
    rewards, mask = _token_rewards(inputs)  # [B, T]
    gamma = float(params.gamma)
    r_t, m_t = (rearrange(x, "b t -> t b").contiguous() for x in (rewards, mask))  # [T, B] time-major
    ret_t = torch.empty_like(r_t)  # [T, B]
    running = torch.zeros_like(r_t[0])  # [B]
    for t in range(r_t.shape[0] - 1, -1, -1):
        m = m_t[t]  # [B]
        new = r_t[t] + gamma * running  # [B]
        ret_t[t] = new * m
        # masked tokens (padding, tool observations) carry the running return through unchanged,
        # so an outcome reward reaches the tokens before an observation span (verl, and our gae)
        running = new * m + (1.0 - m) * running  # [B]
    returns = rearrange(ret_t, "t b -> b t")  # [B, T]
    advantages = masked_whiten(returns, mask) * mask  # [B, T]
    return AdvantageOutput(advantages=advantages, returns=returns * mask)


@torch.no_grad()
def reinforce_plus_plus_baseline(
    inputs: AdvantageInputs, params: ReinforcePlusPlusBaselineParams
) -> AdvantageOutput:
    """REINFORCE++-baseline (verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``)."""
    scores = _outcome_scores(inputs)  # [B]
    mask = inputs.response_mask.to(scores.dtype)  # [B, T]
    inverse, num_groups = group_index(inputs.group_ids, "reinforce_plus_plus_baseline")
    count, mean, _ = _group_stats(scores, inverse, num_groups)  # [G]
    mean = torch.where(count == 1, torch.zeros_like(mean), mean)  # [G]
    centered = (scores - mean[inverse]).unsqueeze(-1) * mask  # [B, T]
    adv = masked_whiten(centered, mask) * mask  # [B, T]
    return AdvantageOutput(advantages=adv, returns=adv)


@torch.no_grad()
def remax(inputs: AdvantageInputs, params: ReMaxParams) -> AdvantageOutput:
    """ReMax (verl ``compute_remax_outcome_advantage``): return-to-go minus the greedy reward."""
    greedy = _needed(inputs.baseline_rewards, "remax", "baseline_rewards (capability needs_greedy_baseline)")
    rewards, mask = _token_rewards(inputs)  # [B, T]
    returns = _reward_to_go(rewards, mask)  # [B, T]
    baseline = greedy.to(rewards.dtype).unsqueeze(-1)  # [B, 1]
    advantages = (returns - baseline * mask) * mask  # [B, T]
    return AdvantageOutput(advantages=advantages, returns=returns * mask)


# ---------------------------------------------------------------------------------------------
# decoupled multi-reward GRPO and optimal token baselines
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def gdpo(inputs: AdvantageInputs, params: GDPOParams) -> AdvantageOutput:
    """GDPO (verl ``compute_gdpo_outcome_advantage``): GRPO per reward component, weighted sum,
    then whitened over the batch's valid tokens.

    Components come from ``inputs.reward_components [B, K]``; without them (and with no
    ``reward_keys`` asked for) the single outcome reward is the one component, as in verl.
    """
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)  # [B, T]
    comps = inputs.reward_components
    if comps is None:
        if params.reward_keys:
            raise ValueError(
                f"advantage 'gdpo' was given reward_keys {list(params.reward_keys)} but no "
                "reward_components [B, K]: the reward manager must return those keys per sample"
            )
        comps = _outcome_scores(inputs).unsqueeze(-1)  # [B, 1]
    comps = comps.to(mask.dtype)  # [B, K]
    k = comps.shape[-1]
    if params.reward_keys and len(params.reward_keys) != k:
        raise ValueError(f"gdpo: {len(params.reward_keys)} reward_keys but {k} reward components")
    weights = list(params.reward_weights) if params.reward_weights else [1.0] * k
    if len(weights) != k:
        raise ValueError(f"gdpo: reward_weights has {len(weights)} entries, expected one per component ({k})")
    inverse, num_groups = group_index(inputs.group_ids, "gdpo")
    total = torch.zeros_like(comps[:, 0])  # [B]
    for j in range(k):
        adv = _group_normalized(comps[:, j], inverse, num_groups, params.norm_by_std, params.epsilon)  # [B]
        total = total + float(weights[j]) * adv
    summed = total.unsqueeze(-1) * mask  # [B, T]
    advantages = masked_whiten(summed, mask) * mask  # [B, T]
    return AdvantageOutput(advantages=advantages, returns=advantages)


def _token_baseline(
    returns: Tensor,
    w_cum: Tensor,
    mask: Tensor,
    inverse: Tensor,
    num_groups: int,
    handle_zero_tail: bool,
    epsilon: float,
) -> Tensor:
    """Per-position group baseline ``B_t = sum_i G_it W_it / (sum_i W_it + eps)`` ``[B, T]``.

    A group of one gets baseline 0. With ``handle_zero_tail`` a group's single longest response
    gets baseline 0 from the second-longest length on (nothing to compare it with there).
    """
    num = torch.zeros(num_groups, returns.shape[1], dtype=returns.dtype, device=returns.device)
    den = torch.zeros_like(num)  # [G, T]
    num.index_add_(0, inverse, returns * w_cum * mask)
    den.index_add_(0, inverse, w_cum * mask)
    baseline = (num / (den + epsilon))[inverse]  # [B, T]
    count = torch.bincount(inverse, minlength=num_groups)  # [G]
    baseline = baseline * (count[inverse] > 1).to(baseline.dtype).unsqueeze(-1)  # [B, T]
    if handle_zero_tail:
        lengths = mask.sum(-1)  # [B]
        neg = torch.full((num_groups,), -1.0, dtype=lengths.dtype, device=lengths.device)
        longest = neg.scatter_reduce(0, inverse, lengths, "amax")  # [G]
        is_max = lengths == longest[inverse]  # [B]
        n_max = torch.zeros(num_groups, dtype=torch.long, device=lengths.device)
        n_max.index_add_(0, inverse, is_max.long())  # [G]
        others = torch.where(is_max, torch.full_like(lengths, -1.0), lengths)  # [B]
        second = neg.scatter_reduce(0, inverse, others, "amax")  # [G]
        unique = is_max & (n_max[inverse] == 1) & (count[inverse] > 1)  # [B]
        positions = torch.arange(mask.shape[1], device=mask.device, dtype=lengths.dtype)  # [T]
        tail = unique.unsqueeze(-1) & (positions.unsqueeze(0) >= second[inverse].unsqueeze(-1))  # [B, T]
        baseline = baseline.masked_fill(tail, 0.0)
    return baseline


def _otb_parts(inputs: AdvantageInputs, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(mask, returns-to-go, W cumulative)`` ``[B, T]`` of the optimal token baselines."""
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise ValueError(
            f"advantage {name!r} needs old_log_probs and sum_pi_squared [B, T] (sum over the "
            "vocabulary of pi^2 per token, from the train backend's old-log-prob forward)"
        )
    rewards, mask = _token_rewards(inputs)  # [B, T]
    returns = _reward_to_go(rewards, mask)  # [B, T]
    # ||s_t||^2 proxy 1 - 2 pi_t + sum_v pi_v^2; with IS weights scaled by rho^2
    w = 1.0 - 2.0 * inputs.old_log_probs.to(rewards.dtype).exp() + inputs.sum_pi_squared.to(rewards.dtype)
    if inputs.rollout_is_weights is not None:
        w = w * inputs.rollout_is_weights.to(rewards.dtype).square()  # [B, T]
    w = torch.where(mask > 0, w, torch.zeros_like(w))  # padding may hold anything
    w_cum = (w * mask).cumsum(-1)  # [B, T] W_t = sum_{j <= t} w_j
    return mask, returns, w_cum


@torch.no_grad()
def optimal_token_baseline(inputs: AdvantageInputs, params: OptimalTokenBaselineParams) -> AdvantageOutput:
    """Optimal token baseline (verl ``compute_optimal_token_baseline_advantage``).

    ``A_t = G_t - B_t`` with the per-position group baseline ``B_t = E[G_t W_t] / E[W_t]``,
    ``W_t`` the cumulative path-variance proxy ``sum_{j <= t} (1 - 2 pi_j + sum_v pi_v^2)``.
    """
    mask, returns, w_cum = _otb_parts(inputs, "optimal_token_baseline")
    inverse, num_groups = group_index(inputs.group_ids, "optimal_token_baseline")
    baseline = _token_baseline(
        returns, w_cum, mask, inverse, num_groups, params.handle_zero_tail, params.epsilon
    )  # [B, T]
    return AdvantageOutput(advantages=(returns - baseline) * mask, returns=returns * mask)


@torch.no_grad()
def tir_optimal_token_baseline(
    inputs: AdvantageInputs, params: TIROptimalTokenBaselineParams
) -> AdvantageOutput:
    """Multi-turn optimal token baseline (verl ``compute_multi_turn_optimal_token_baseline_advantage``).

    As :func:`optimal_token_baseline`, but positions are counted in valid tokens: each response's
    unmasked tokens are packed to the left first, so tool-observation spans inside a response do
    not shift the positions compared across the group. Empty responses take no part.
    """
    mask, returns, w_cum = _otb_parts(inputs, "tir_optimal_token_baseline")
    inverse, _ = group_index(inputs.group_ids, "tir_optimal_token_baseline")
    b_idx, t_idx = mask.nonzero(as_tuple=True)  # valid tokens
    pos = (mask.cumsum(-1) - 1).long()[b_idx, t_idx]  # their rank within the response
    packed_r = torch.zeros_like(returns)  # [B, T]
    packed_w = torch.zeros_like(returns)  # [B, T]
    packed_m = torch.zeros_like(returns)  # [B, T]
    packed_r[b_idx, pos] = returns[b_idx, t_idx]
    packed_w[b_idx, pos] = w_cum[b_idx, t_idx]
    packed_m[b_idx, pos] = 1.0
    rows = (mask.sum(-1) > 0).nonzero(as_tuple=True)[0]  # [B'] non-empty responses
    advantages = torch.zeros_like(returns)  # [B, T]
    if rows.numel():
        sub_inv, sub_groups = group_index(inverse[rows], "tir_optimal_token_baseline")
        baseline = _token_baseline(
            packed_r[rows],
            packed_w[rows],
            packed_m[rows],
            sub_inv,
            sub_groups,
            params.handle_zero_tail,
            params.epsilon,
        )  # [B', T]
        packed_adv = torch.zeros_like(returns)
        packed_adv[rows] = (packed_r[rows] - baseline) * packed_m[rows]
        advantages[b_idx, t_idx] = packed_adv[b_idx, pos]
    return AdvantageOutput(advantages=advantages * mask, returns=returns * mask)
