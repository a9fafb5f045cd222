"""Built-in policy losses (kind ``policy_loss``).

Import-light: params and registration only; the tensor code is
:mod:`rlzoo.algorithms.functional.policy_loss`. Formulas match verl's ``core_algos.py``; each loss
reduces its per-token loss with the selected aggregation (``inputs.agg``). Details, paper links
and the differences from verl: docs/components/policy_loss.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param
from rlzoo.kernel.errors import raise_problems
from rlzoo.kernel.params import check_ranges

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import PolicyLossFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.policy_loss"

_CLIP_LOW = "ratio lower clip: r is clipped at 1 - clip_ratio_low"
_CLIP_HIGH = "ratio upper clip: r is clipped at 1 + clip_ratio_high (clip-higher: > clip_ratio_low)"


class ClipBounds:
    """Base of the params with clip bounds: ``clip_ratio_low`` and ``clip_ratio_high`` must be >= 0,
    and every field in the range its ``param`` declares."""

    clip_ratio_low: float
    clip_ratio_high: float

    def __post_init__(self) -> None:
        low, high = self.clip_ratio_low, self.clip_ratio_high
        if low < 0 or high < 0:
            raise ValueError(f"clip_ratio_low / clip_ratio_high must be >= 0, got {low} / {high}")
        raise_problems(type(self).__name__, check_ranges(self))


@dataclass(frozen=True)
class PPOClipParams(ClipBounds):
    """PPO clipped surrogate with clip-higher and dual clip (verl: vanilla).

    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and for A < 0 also min(l, -A c)
    (dual clip, https://arxiv.org/abs/1912.09729). r = exp(clamp(log pi - log pi_old, -20, 20)).
    PPO: https://arxiv.org/abs/1707.06347; clip-higher (DAPO): https://arxiv.org/abs/2503.14476.
    """

    clip_ratio_low: float = param(0.2, help=_CLIP_LOW)
    clip_ratio_high: float = param(0.2, help=_CLIP_HIGH + "; DAPO uses 0.28")
    clip_ratio_c: float = param(
        3.0, gt=1.0, help="dual-clip bound for A < 0: the loss is at most -A * c (c > 1)"
    )


@dataclass(frozen=True)
class GSPOParams(ClipBounds):
    """GSPO: PPO clip on the sequence ratio (geometric mean of token ratios), token form.

    s_i = exp(mean_t log r_t); per token s_it = sg[s_i] pi_t / sg[pi_t];
    l = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high)). The paper aggregates with
    seq-mean-token-mean (https://arxiv.org/abs/2507.18071).
    """

    clip_ratio_low: float = param(3e-4, help=_CLIP_LOW + " (the paper: 3e-4)")
    clip_ratio_high: float = param(4e-4, help=_CLIP_HIGH + " (the paper: 4e-4)")


@dataclass(frozen=True)
class CISPOParams(ClipBounds):
    """CISPO: REINFORCE with a clipped, stop-gradient IS weight; no token loses its gradient.

    l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A log pi (MiniMax-M1, https://arxiv.org/abs/2506.13585).
    """

    clip_ratio_low: float = param(0.2, help=_CLIP_LOW + "; 1.0 removes the lower bound (the paper)")
    clip_ratio_high: float = param(0.2, help=_CLIP_HIGH)


@dataclass(frozen=True)
class SAPOParams:
    """SAPO: soft sigmoid gate on the token ratio instead of a hard clip.

    l = -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos for A > 0 else tau_neg. The paper
    aggregates with seq-mean-token-mean (https://arxiv.org/abs/2511.20347).
    """

    tau_pos: float = param(1.0, help="gate temperature for tokens with A > 0 (larger: sharper gate)")
    tau_neg: float = param(1.05, help="gate temperature for tokens with A <= 0")

    def __post_init__(self) -> None:
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos} / {self.tau_neg}")


@dataclass(frozen=True)
class GPGParams:
    """GPG: plain policy gradient without ratio or clip, l = -A log pi.

    Group Policy Gradient (https://arxiv.org/abs/2504.02546).
    """


@dataclass(frozen=True)
class NLLParams:
    """NLL: supervised fine-tuning on demonstrations, l = -log pi (the advantages are not read).

    The per-token negative log-likelihood of the batch's response tokens, reduced with the selected
    aggregation: ``token-mean`` is TRL's ``SFTTrainer`` loss (the mean over every trained token of
    the mini-batch), ``seq-mean-token-mean`` weighs each demonstration equally. Train on
    demonstrations with ``runner: sft`` (docs/distillation.md, "SFT and stages").
    """


@dataclass(frozen=True)
class ReinforceISParams:
    """REINFORCE with explicit, truncated importance weights, l = -A w log pi, w = stopgrad(min(pi / pi_old, c)).

    verl's bypass-mode ``loss_type: reinforce`` (``compute_policy_loss_reinforce``): in bypass mode
    (``rollout_correction.mode: bypass``) ``pi_old`` is the rollout policy, so ``w`` corrects the
    rollout/trainer mismatch at every micro-batch with the current policy. ``is_level`` ``token``: one
    weight per token; ``sequence``: the product of a response's ratios; ``none``: plain REINFORCE (GPG).
    With ``batch_normalize`` the weights are divided by their mean over the micro-batch, as verl does.
    No clipping. Reports ``ppo_kl`` and verl's ``rollout_is_*`` weight statistics.
    """

    is_level: str = param("token", help="'token', 'sequence' or 'none' (no weights)")
    threshold: float = param(2.0, gt=0, help="upper truncation of the weights (verl's rollout_is_threshold)")
    batch_normalize: bool = param(
        False, help="divide the weights by their mean (verl's rollout_is_batch_normalize)"
    )

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        if self.is_level not in ("token", "sequence", "none"):
            problems.append(f"is_level must be 'token', 'sequence' or 'none', got {self.is_level!r}")
        raise_problems(type(self).__name__, problems)


@dataclass(frozen=True)
class GeoMeanParams(ClipBounds):
    """GMPO: maximise the geometric mean of token-clipped ratios times the sequence advantage.

    d_t = sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -eps_low, eps_high));
    L_i = -mean_t(A) exp(mean_t d_t). The paper averages over sequences (seq-mean-token-mean).
    Geometric-Mean Policy Optimization, https://arxiv.org/abs/2507.20673.
    """

    clip_ratio_low: float = param(0.4, help="log-ratio lower clip: log r clipped at -clip_ratio_low")
    clip_ratio_high: float = param(0.4, help="log-ratio upper clip: log r clipped at +clip_ratio_high")


@dataclass(frozen=True)
class DPPOTVParams(ClipBounds):
    """DPPO-Binary-TV: keep a token's gradient only while |p - p_old| stays within a TV bound.

    l = -A sg[min(r, c)] log pi * keep; keep = (p - p_old <= delta_high) for A > 0,
    (p - p_old >= -delta_low) for A <= 0. https://arxiv.org/abs/2602.04879.
    """

    clip_ratio_low: float = param(0.2, help="TV threshold delta_low for A <= 0 (on p - p_old, not on r)")
    clip_ratio_high: float = param(0.2, help="TV threshold delta_high for A > 0 (on p - p_old, not on r)")
    clip_ratio_c: float = param(20.0, help="truncation of the (stop-gradient) IS ratio: min(r, c)")


@dataclass(frozen=True)
class DPPOKLParams(ClipBounds):
    """DPPO-Binary-KL: keep a token's gradient only while the binary KL stays within a bound.

    KL_b = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)); keep = KL_b <= delta_high
    or p <= p_old (A > 0), KL_b <= delta_low or p >= p_old (A <= 0);
    l = -A sg[min(r, c)] log pi * keep. https://arxiv.org/abs/2602.04879.
    """

    clip_ratio_low: float = param(0.2, help="binary-KL threshold delta_low for A <= 0 (nats)")
    clip_ratio_high: float = param(0.2, help="binary-KL threshold delta_high for A > 0 (nats)")
    clip_ratio_c: float = param(20.0, help="truncation of the (stop-gradient) IS ratio: min(r, c)")


@dataclass(frozen=True)
class ClipCovParams(ClipBounds):
    """Clip-Cov: PPO clip, and detach a random few tokens of high advantage/log-prob covariance.

    Entropy Mechanism of RL, https://arxiv.org/abs/2505.22617.
    """

    clip_ratio_low: float = param(0.2, help=_CLIP_LOW)
    clip_ratio_high: float = param(0.2, help=_CLIP_HIGH)
    clip_cov_ratio: float = param(2e-4, gt=0, help="fraction of valid tokens whose gradient is removed")
    clip_cov_lb: float = param(1.0, help="only tokens with covariance above this are candidates")
    clip_cov_ub: float = param(5.0, help="only tokens with covariance below this are candidates")


@dataclass(frozen=True)
class KLCovParams:
    """KL-Cov: unclipped surrogate plus a |log r| penalty on the highest-covariance tokens.

    Entropy Mechanism of RL, https://arxiv.org/abs/2505.22617.
    """

    kl_cov_ratio: float = param(2e-4, help="fraction of valid tokens (top covariance) that get the KL term")
    ppo_kl_coef: float = param(1.0, help="coefficient k of the k * |log r| penalty")

    def __post_init__(self) -> None:
        if not self.kl_cov_ratio > 0:
            raise ValueError(f"kl_cov_ratio must be > 0, got {self.kl_cov_ratio}")


@dataclass(frozen=True)
class DROParams:
    """DRO: policy gradient with a quadratic penalty on the log-ratio, instead of a clip.

    l = -(A log pi - beta / 2 (log pi - log pi_old)^2) (verl's dro loss, its dro_beta).
    Direct Reward Optimization, Richemond et al. 2024, https://arxiv.org/abs/2405.19107.
    """

    beta: float = param(0.1, help="weight of the (log pi - log pi_old)^2 / 2 penalty (> 0; verl's dro_beta)")

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"dro beta must be > 0, got {self.beta}")


_OLD = {"needs_old_log_probs": True}
_SEQ_MEAN = {"fixed_aggregation": "seq-mean-token-mean"}
#: Not a well-known key: the loss selects tokens from statistics of the micro-batch it is given,
#: so its value depends on how the mini-batch is split (as in verl).
_BATCH_STATS = {"batch_statistics": True}


@hookimpl
def rlzoo_register_policy_losses(registry: Registrar[PolicyLossFn]) -> None:
    registry.register(
        "ppo_clip", f"{_IMPL}:ppo_clip", params=PPOClipParams, capabilities=_OLD, aliases=("vanilla",)
    )
    registry.register(
        "gspo", f"{_IMPL}:gspo", params=GSPOParams, capabilities={**_OLD, **_SEQ_MEAN, "sequence_level": True}
    )
    registry.register("cispo", f"{_IMPL}:cispo", params=CISPOParams, capabilities=_OLD)
    registry.register("sapo", f"{_IMPL}:sapo", params=SAPOParams, capabilities={**_OLD, **_SEQ_MEAN})
    registry.register("gpg", f"{_IMPL}:gpg", params=GPGParams, capabilities={"needs_old_log_probs": False})
    registry.register(
        "geo_mean",
        f"{_IMPL}:geo_mean",
        params=GeoMeanParams,
        capabilities={**_OLD, **_SEQ_MEAN, "sequence_level": True},
        aliases=("gmpo",),
    )
    registry.register(
        "nll",
        f"{_IMPL}:nll",
        params=NLLParams,
        capabilities={"needs_old_log_probs": False, "reads_advantages": False},
    )
    registry.register("reinforce_is", f"{_IMPL}:reinforce_is", params=ReinforceISParams, capabilities=_OLD)
    registry.register("dppo_tv", f"{_IMPL}:dppo_tv", params=DPPOTVParams, capabilities=_OLD)
    registry.register("dppo_kl", f"{_IMPL}:dppo_kl", params=DPPOKLParams, capabilities=_OLD)
    registry.register("dro", f"{_IMPL}:dro", params=DROParams, capabilities=_OLD)
    registry.register(
        "clip_cov", f"{_IMPL}:clip_cov", params=ClipCovParams, capabilities={**_OLD, **_BATCH_STATS}
    )
    registry.register("kl_cov", f"{_IMPL}:kl_cov", params=KLCovParams, capabilities={**_OLD, **_BATCH_STATS})
