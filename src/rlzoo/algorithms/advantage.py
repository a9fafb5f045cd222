"""Built-in advantage estimators (kind ``advantage``): params and registration.

Import-light: the tensor code lives in :mod:`rlzoo.algorithms.functional.advantage` and is only
imported when a part is loaded. Formulas match verl's ``core_algos.py``; see
``docs/components/advantage.md`` for the details and the deliberate differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import AdvantageFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.advantage"


@dataclass(frozen=True)
class GAEParams:
    """Generalized Advantage Estimation with a critic (PPO); advantages whitened over the batch.

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};  returns = A + V.
    Masked tokens inside a response are skipped (they carry V and A through). The advantages are
    then whitened over all unmasked tokens of the batch. Schulman et al. 2015,
    https://arxiv.org/abs/1506.02438.
    """

    gamma: float = param(1.0, help="discount factor")
    lam: float = param(1.0, help="GAE lambda (bias / variance trade-off)")
    whiten: bool = param(
        True, help="whiten advantages over the unmasked tokens of the batch (verl always does)"
    )


@dataclass(frozen=True)
class GRPOParams:
    """Group-relative advantage (GRPO): (r - mean_group) / (std_group + eps).

    r is the response's outcome reward (token rewards summed over the response). std is the unbiased
    group std; a group of one gets mean 0 and std 1. With norm_by_std=False this is Dr.GRPO (r -
    mean_group). Shao et al. 2024, https://arxiv.org/abs/2402.03300; Dr.GRPO:
    https://arxiv.org/abs/2503.20783.
    """

    norm_by_std: bool = param(True, help="divide by the group's std; False gives Dr.GRPO")
    epsilon: float = param(1e-6, help="added to the std")


@dataclass(frozen=True)
class TurnGRPOParams:
    """GRPO with per-turn credit: each model turn's tokens get its turn-level return's advantage.

    r_ik is the reward of trajectory i's model turn k (an environment's per-turn reward sits on the
    last token of the turn it rewards); G_ik = sum_{j >= k} gamma^(j - k) r_ij, the return from turn
    k on. A = (G_ik - mean_g) / (std_g + eps) on turn k's tokens, mean_g and std_g (unbiased) over
    the group's G_i0; a group of one has mean 0 and std 1. With one reward at the end and gamma =
    1 every turn gets G_i0 = r_i: plain GRPO. Turns are AdvantageInputs.turn_ids (multi-turn
    batches), else the runs of unmasked tokens. Returns are G_ik on turn k's tokens. Reward-to-go
    over turns as in REINFORCE (Williams 1992); the group baseline is GRPO's,
    https://arxiv.org/abs/2402.03300.
    """

    gamma: float = param(1.0, ge=0, le=1, help="discount per model turn")
    norm_by_std: bool = param(True, help="divide by the group's std of trajectory returns")
    epsilon: float = param(1e-6, help="added to the std")


@dataclass(frozen=True)
class TokenGRPOParams:
    """GRPO with per-token credit, for dense (per-token) rewards on a format the group shares.

    r_it is the reward on response token t of sample i (an environment's dense rewards sit on
    their own tokens; an outcome reward on the last token). Each token is normalized against the
    rewards of the group's tokens at the same place -- the same model turn and the same index in
    it (AdvantageInputs.turn_ids; without them the runs of unmasked tokens are the turns):
    n_it = (r_it - mean_place) / (std_place + eps) (unbiased std; a place only one sample of the
    group reaches gets n = 0). A_it = sum over trained tokens s >= t of gamma^(k(s) - k(t)) n_is,
    k counting trained tokens (observations are skipped); returns = A. gamma = 0: each token's
    credit is its own reward (a per-token bandit); gamma = 1: REINFORCE's reward-to-go. The
    group baseline is GRPO's (https://arxiv.org/abs/2402.03300) taken per place, as DeepSeekMath's
    process-supervision GRPO takes it per step (the same paper, section 4.1.3); reward-to-go as
    in REINFORCE (Williams 1992). Places line up only when the group's responses share a format;
    with only an outcome reward on responses of different lengths use grpo.
    """

    gamma: float = param(
        0.5, ge=0, le=1, help="discount per trained token of the normalized rewards after it"
    )
    norm_by_std: bool = param(True, help="divide by the std of the group's rewards at the token's place")
    epsilon: float = param(1e-6, help="added to the std")


@dataclass(frozen=True)
class RLOOParams:
    """REINFORCE leave-one-out: r minus the mean reward of the other responses of its group.

    A = r - (sum_group - r) / (n - 1) = (r - mean_group) * n / (n - 1); a group of one keeps A = r.
    Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740.
    """


@dataclass(frozen=True)
class ReinforcePlusPlusParams:
    """REINFORCE++: discounted return-to-go, whitened over all unmasked tokens of the batch.

    G_t = r_t + gamma * G_{t+1} over the unmasked tokens; a masked token (padding, a tool
    observation) carries G through unchanged, as verl does. A = whiten(G). No critic, no groups.
    Hu 2025, https://arxiv.org/abs/2501.03262.
    """

    gamma: float = param(1.0, help="discount factor")


@dataclass(frozen=True)
class ReinforcePlusPlusBaselineParams:
    """REINFORCE++-baseline: subtract the group mean reward, then whiten over the batch.

    A = whiten(r - mean_group) over the unmasked tokens (a group of one has mean 0).
    Hu 2025, https://arxiv.org/abs/2501.03262.
    """


@dataclass(frozen=True)
class ReMaxParams:
    """ReMax: reward-to-go minus the reward of the greedy response to the same prompt.

    A_t = sum_{s>=t} r_s - r_greedy. Needs baseline_rewards [B] (capability needs_greedy_baseline).
    Li et al. 2023, https://arxiv.org/abs/2310.10505.
    """


@dataclass(frozen=True)
class OPOParams:
    """OPO: reward minus the length-weighted mean reward of the group (optimal baseline).

    b = sum_i(|y_i| * r_i) / sum_i |y_i| over the group; A = r - b; a group of one has b = 0.
    https://arxiv.org/abs/2505.23585.
    """


@dataclass(frozen=True)
class GPGParams:
    """GPG: alpha * (r - mean_group) / f_norm, alpha = B / #responses with non-zero reward.

    A group of one has mean 0. GPG, https://arxiv.org/abs/2504.02546.
    """

    f_norm: float = param(1.0, help="divisor of the advantage (verl fixes it to 1)")


@dataclass(frozen=True)
class GRPOPassKParams:
    """Pass@k GRPO: only each group's best response gets r_max - r_second_max (/ std + eps).

    Every other response gets 0. Needs at least two responses per group.
    https://arxiv.org/abs/2503.19595.
    """

    norm_by_std: bool = param(True, help="divide by the group's std")
    epsilon: float = param(1e-6, help="added to the std")


@dataclass(frozen=True)
class GDPOParams:
    """GDPO: GRPO-normalise each reward component within its group, sum with weights, whiten.

    A = whiten(sum_k w_k (r_k - mean_group(r_k)) / (std_group(r_k) + eps)) over the batch's valid
    tokens, so a dominant reward does not drown a weaker one. The components come from the reward
    manager (reward_components [B, K]); with none, the outcome reward is the single component.
    Group reward-Decoupled Normalization, https://arxiv.org/abs/2601.05242.
    """

    reward_keys: list[str] = param(
        [], help="names of the reward components (verl's gdpo_reward_keys), in reward_components order"
    )
    reward_weights: list[float] = param(
        [], help="weight per component (verl's gdpo_reward_weights); []: all 1"
    )
    norm_by_std: bool = param(True, help="divide each component by its group std")
    epsilon: float = param(1e-6, help="added to the std")


@dataclass(frozen=True)
class OptimalTokenBaselineParams:
    """Optimal token baseline: a per-position group baseline weighted by path variance.

    A_t = G_t - B_t, B_t = sum_i G_it W_it / sum_i W_it over the group, with W_t = sum_{j<=t}
    (1 - 2 pi_j + sum_v pi_v^2) (times the squared rollout IS weight when there is one). Needs
    old_log_probs and sum_pi_squared from the train backend. A group of one gets B = 0.
    verl 0.9.1's optimal_token_baseline (core_algos.compute_optimal_token_baseline_advantage).
    """

    handle_zero_tail: bool = param(
        True, help="the group's single longest response gets B = 0 past the second-longest length"
    )
    epsilon: float = param(1e-8, help="added to the sum of W")


@dataclass(frozen=True)
class TIROptimalTokenBaselineParams:
    """Optimal token baseline for multi-turn / tool responses: positions count valid tokens only.

    As optimal_token_baseline, after packing each response's unmasked tokens to the left, so
    tool-observation spans do not shift the positions compared across the group; empty responses
    take no part. verl's tir_optimal_token_baseline.
    """

    handle_zero_tail: bool = param(
        True, help="the group's single longest response gets B = 0 past the second-longest length"
    )
    epsilon: float = param(1e-8, help="added to the sum of W")


@hookimpl
def rlzoo_register_advantages(registry: Registrar[AdvantageFn]) -> None:
    group = {"needs_group": True}
    registry.register("gae", f"{_IMPL}:gae", params=GAEParams, capabilities={"needs_critic": True})
    # verl's *_vectorized estimators are the same formulas (see docs: a group of one under rloo)
    registry.register(
        "grpo", f"{_IMPL}:grpo", params=GRPOParams, capabilities=group, aliases=("grpo_vectorized",)
    )
    registry.register("turn_grpo", f"{_IMPL}:turn_grpo", params=TurnGRPOParams, capabilities=group)
    registry.register("token_grpo", f"{_IMPL}:token_grpo", params=TokenGRPOParams, capabilities=group)
    registry.register(
        "rloo", f"{_IMPL}:rloo", params=RLOOParams, capabilities=group, aliases=("rloo_vectorized",)
    )
    registry.register(
        "reinforce_plus_plus",
        f"{_IMPL}:reinforce_plus_plus",
        params=ReinforcePlusPlusParams,
        capabilities={},
        aliases=("reinforce++",),
    )
    registry.register(
        "reinforce_plus_plus_baseline",
        f"{_IMPL}:reinforce_plus_plus_baseline",
        params=ReinforcePlusPlusBaselineParams,
        capabilities=group,
        aliases=("reinforce++_baseline",),
    )
    registry.register(
        "remax", f"{_IMPL}:remax", params=ReMaxParams, capabilities={"needs_greedy_baseline": True}
    )
    registry.register("opo", f"{_IMPL}:opo", params=OPOParams, capabilities=group)
    registry.register("gpg", f"{_IMPL}:gpg", params=GPGParams, capabilities=group)
    registry.register("grpo_passk", f"{_IMPL}:grpo_passk", params=GRPOPassKParams, capabilities=group)
    registry.register(
        "gdpo", f"{_IMPL}:gdpo", params=GDPOParams, capabilities={**group, "needs_reward_components": True}
    )
    otb = {**group, "needs_old_log_probs": True, "needs_sum_pi_squared": True}
    registry.register(
        "optimal_token_baseline",
        f"{_IMPL}:optimal_token_baseline",
        params=OptimalTokenBaselineParams,
        capabilities=otb,
    )
    registry.register(
        "tir_optimal_token_baseline",
        f"{_IMPL}:tir_optimal_token_baseline",
        params=TIROptimalTokenBaselineParams,
        capabilities=otb,
    )
