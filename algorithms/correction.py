"""Built-in off-policy corrections (kind ``rollout_correction``): params and registration.

Import-light: the tensor code lives in :mod:`rlzoo.algorithms.functional.correction`. Every part
has a ``mode`` param: ``decoupled`` (three policies: the loss's PPO ratio is taken against the
trainer's recomputed ``old_log_probs`` and the importance weights multiply the per-token loss) or
``bypass`` (two policies: ``old_log_probs := rollout_log_probs``, no recomputation; the PPO ratio
itself corrects, so no weights are returned; rejection still applies). Names and metrics follow
verl's ``rollout_corr_helper.py``; see ``docs/components/rollout_correction.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlzoo import hookimpl, param

_IMPL = "rlzoo.algorithms.functional.correction"

_MODE_HELP = (
    "'decoupled': PPO ratio vs the trainer's old log-probs, weights multiply the loss (three "
    "policies); 'bypass': old log-probs := rollout log-probs (two policies, no weights)"
)


@dataclass(frozen=True)
class NoCorrectionParams:
    """No off-policy correction: no importance weights, response mask unchanged.

    With mode='bypass' the trainer still uses the rollout log-probs as old log-probs (plain
    two-policy PPO), skipping the recomputation.
    """

    mode: str = param("decoupled", help=_MODE_HELP)


@dataclass(frozen=True)
class TokenISParams:
    """Token-level truncated importance sampling (TIS): w_t = min(pi_old / pi_rollout, threshold).

    Corrects the mismatch between the rollout engine and the trainer token by token (biased, low
    variance). Yao et al., Your efficient RL framework secretly brings you off-policy RL training,
    https://fengyao.notion.site/off-policy-rl.
    """

    threshold: float | None = param(2.0, help="upper truncation of the weights (None: no truncation)")
    batch_normalize: bool = param(False, help="rescale the weights to mean 1 over the batch's tokens")
    mode: str = param("decoupled", help=_MODE_HELP)


@dataclass(frozen=True)
class SeqISParams:
    """Sequence-level truncated importance sampling: w = min(prod_t pi_old / pi_rollout, threshold).

    One weight per response, exp(sum of token log-ratios), broadcast over its tokens (unbiased
    before truncation, high variance). https://fengyao.notion.site/off-policy-rl.
    """

    threshold: float | None = param(2.0, help="upper truncation of the weights (None: no truncation)")
    batch_normalize: bool = param(False, help="rescale the weights to mean 1 over the batch's sequences")
    mode: str = param("decoupled", help=_MODE_HELP)


@dataclass(frozen=True)
class IcePopParams:
    """IcePop: mask tokens whose ratio pi_old / pi_rollout is outside [low, high].

    Kept tokens are weighted by their ratio (apply_weights), masked ones leave the loss. Ling team,
    Every Step Evolves (Ring-1T), https://arxiv.org/abs/2510.18855.
    """

    low: float = param(0.5, help="smallest token ratio kept")
    high: float = param(5.0, help="largest token ratio kept")
    apply_weights: bool = param(True, help="weight kept tokens by their ratio (False: masking only)")
    mode: str = param("decoupled", help=_MODE_HELP)


@dataclass(frozen=True)
class RejectionParams:
    """Rejection sampling: drop tokens or whole responses whose k1 / k2 / k3 mismatch is too large.

    With rho_t = log pi_old - log pi_rollout: k1 = -rho (kept when the ratio lies in
    [ratio_low, ratio_high]), k2 = rho^2 / 2, k3 = exp(rho) - 1 - rho (kept when <= threshold).
    agg picks the level: token, or per sequence seq_sum / seq_mean (geometric) / seq_max; verl's
    rollout_rs option seq_mean_k3 is metric=k3, agg=seq_mean. is_level adds truncated IS weights.
    """

    metric: str = param("k3", help="'k1' (ratio bounds), 'k2' or 'k3' (upper threshold)")
    agg: str = param("seq_mean", help="'token', 'seq_sum', 'seq_mean' or 'seq_max' (not for k1)")
    threshold: float = param(0.01, help="largest k2 / k3 statistic kept")
    ratio_low: float = param(0.5, help="k1: smallest (token / sequence / geometric-mean) ratio kept")
    ratio_high: float = param(2.0, help="k1: largest ratio kept")
    is_level: str = param("none", help="also return truncated IS weights: 'none', 'token' or 'sequence'")
    is_threshold: float = param(2.0, help="upper truncation of those IS weights")
    mode: str = param("decoupled", help=_MODE_HELP)


@hookimpl
def rlzoo_register_rollout_corrections(registry):  # type: ignore[no-untyped-def]
    needs = {"needs_old_log_probs": True}
    registry.register("none", f"{_IMPL}:none", params=NoCorrectionParams, capabilities={})
    registry.register(
        "token_is", f"{_IMPL}:token_is", params=TokenISParams, capabilities=needs, aliases=("tis",)
    )
    registry.register(
        "seq_is",
        f"{_IMPL}:seq_is",
        params=SeqISParams,
        capabilities={**needs, "sequence_level": True},
    )
    registry.register("icepop", f"{_IMPL}:icepop", params=IcePopParams, capabilities=needs)
    registry.register("rejection", f"{_IMPL}:rejection", params=RejectionParams, capabilities=needs)
