"""Distillation objectives (on-policy distillation): params and registration.

Import-light: the tensor code lives in :mod:`rlzoo.algorithms.functional.distill`. A teacher
(``algorithm.teacher``) scores the student's sampled tokens on the train backend, as the reference
policy does; these parts turn its log-probs into an advantage or a loss term. See
``docs/distillation.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import AdvantageFn, KLFn, PolicyLossFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.distill"


@dataclass(frozen=True)
class ReverseKLAdvantageParams:
    """On-policy distillation: the advantage of each sampled token is minus its reverse KL to a teacher.

    r_t = -(log pi_student(y_t) - log pi_teacher(y_t)) on every trained token (response mask 1;
    a multi-turn trajectory's observation tokens get 0 and are skipped by the discount);
    A_t = sum over later trained tokens k >= t of gamma^(n_k - n_t) r_k, n counting trained tokens
    only (gamma = 0: A_t = r_t, the published recipe); ``whiten`` then centres and scales A over
    the batch's trained tokens. The student's log-probs are the trainer's
    old log-probs (the weights being trained, also under fully_async), the teacher's come from
    ``algorithm.teacher``. The policy loss (e.g. ppo_clip) then minimises the reverse KL
    KL(pi_student || pi_teacher) on the student's own samples. Needs no reward. Thinking Machines,
    "On-Policy Distillation" (2025), https://thinkingmachines.ai/blog/on-policy-distillation/;
    GKD (reverse KL, on-policy), Agarwal et al. 2024, https://arxiv.org/abs/2306.13649.
    """

    gamma: float = param(
        0.0,
        ge=0,
        le=1,
        help="discount over later trained tokens (0: each token's own reverse KL, the published recipe; "
        "1: the KL of the rest of the response)",
    )
    whiten: bool = param(
        False,
        help="whiten the advantages over the batch's trained tokens ((A - mean) / std, as GAE's whiten): a "
        "baseline that lowers the variance of the gradient; false: the published recipe",
    )


@dataclass(frozen=True)
class ScoreFunctionK1Params:
    """k1_sf: the value of k1 (log p - log q) with the score-function gradient (log p - log q) * grad log p.

    On tokens sampled from p, E[(log p - log q) grad log p] is the gradient of the per-token
    reverse KL(p || q); k1's own gradient (grad log p) is zero in expectation. As the teacher-KL
    loss term (``algorithm.teacher_kl_loss``, coefficient ``algorithm.teacher_kl_coef``) beside any
    RL loss it is RL + on-policy distillation mixed (GKD's RL + distillation objective, Agarwal et
    al. 2024, https://arxiv.org/abs/2306.13649, Sec. 3.2). Computed as sg(d) * exp(log p - sg(log p))
    with d = log p - log q: value d, gradient d * grad log p.
    """


@dataclass(frozen=True)
class GKDParams:
    """gkd: generalized Jensen-Shannon divergence to the teacher's whole next-token distribution (GKD).

    Per response token: JSD_beta = beta * KL(p_T || M) + (1 - beta) * KL(p_S || M), M = beta * p_T +
    (1 - beta) * p_S, with p = softmax(logits / temperature) over the whole vocabulary; beta = 0 is
    the forward KL(p_T || p_S), beta = 1 the reverse KL(p_S || p_T). The loss is its aggregation
    (algorithm.loss_agg) over the student's own samples (GKD with on-policy fraction lambda = 1: no
    advantage, no reward, no ratio). The train backend computes it chunk by chunk in the update's
    forward (supplies_teacher_divergence), one teacher forward per micro-batch. TRL's
    GKDTrainer.generalized_jsd_loss is its token-mean. Agarwal et al. 2024, "On-Policy Distillation
    of Language Models: Learning from Self-Generated Mistakes", https://arxiv.org/abs/2306.13649.
    """

    beta: float = param(
        0.5,
        ge=0,
        le=1,
        help="interpolation: 0 forward KL(teacher || student), 1 reverse KL(student || teacher)",
    )
    temperature: float = param(1.0, gt=0, help="softmax temperature of both distributions in the divergence")


@hookimpl
def rlzoo_register_policy_losses(registry: Registrar[PolicyLossFn]) -> None:
    registry.register(
        "gkd", f"{_IMPL}:gkd_loss", params=GKDParams, capabilities={"needs_teacher_distribution": True}
    )


@hookimpl
def rlzoo_register_advantages(registry: Registrar[AdvantageFn]) -> None:
    registry.register(
        "distill_reverse_kl",
        f"{_IMPL}:reverse_kl_advantage",
        params=ReverseKLAdvantageParams,
        capabilities={"needs_old_log_probs": True, "needs_teacher": True},
        aliases=("on_policy_distill",),
    )


@hookimpl
def rlzoo_register_kls(registry: Registrar[KLFn]) -> None:
    registry.register("k1_sf", f"{_IMPL}:k1_score_function", params=ScoreFunctionK1Params)
