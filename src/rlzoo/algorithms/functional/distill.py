"""Distillation objectives: the tensor code behind :mod:`rlzoo.algorithms.distill`.

- :func:`reverse_kl_advantage`: on-policy distillation's per-token advantage
  ``-(log pi_student - log pi_teacher)``, optionally discounted over later trained tokens;
- :func:`k1_score_function`: a KL estimator whose gradient is the score-function gradient of the
  per-token reverse KL (the teacher-KL loss term beside an RL loss);
- :func:`generalized_jsd`: GKD's generalized Jensen-Shannon divergence over the vocabulary, TRL's
  ``GKDTrainer.generalized_jsd_loss`` per token (a pure function of two distributions' logits).

Shapes: ``B`` responses, ``T`` response tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor

from rlzoo.algorithms.functional.advantage import masked_whiten
from rlzoo.kernel.protocols import AdvantageInputs, AdvantageOutput, PolicyLossInputs, PolicyLossOutput

from ..distill import GKDParams, ReverseKLAdvantageParams, ScoreFunctionK1Params

__all__ = ["generalized_jsd", "gkd_loss", "k1_score_function", "reverse_kl_advantage"]


@torch.no_grad()
def reverse_kl_advantage(inputs: AdvantageInputs, params: ReverseKLAdvantageParams) -> AdvantageOutput:
    """``A_t = sum_{k >= t, mask_k = 1} gamma^(n_k - n_t) * -(log pi_s(y_k) - log pi_T(y_k))``.

    ``n`` counts trained tokens (mask 1) only, so an observation between two model turns is no
    step of the discount; advantages and returns are 0 where the mask is 0.
    """
    if inputs.old_log_probs is None or inputs.teacher_log_probs is None:
        missing = "old_log_probs" if inputs.old_log_probs is None else "teacher_log_probs"
        raise ValueError(
            f"distill_reverse_kl: inputs.{missing} is None; the advantage needs the student's log-probs "
            "(needs_old_log_probs) and the teacher's (needs_teacher: set algorithm.teacher.model)"
        )
    mask = inputs.response_mask.to(torch.float32)  # [B, T]
    student = inputs.old_log_probs.to(torch.float32)  # [B, T]
    teacher = inputs.teacher_log_probs.to(torch.float32)  # [B, T]
    rewards = -(student - teacher) * mask  # [B, T]
    gamma = float(params.gamma)
    if gamma == 0.0:
        return _out(rewards, mask, params.whiten)
    # a linear recurrence over time (as GAE): masked tokens carry the running sum through
    r_t, m_t = (rearrange(x, "b t -> t b").contiguous() for x in (rewards, mask))  # [T, B]
    adv_t = torch.empty_like(r_t)  # [T, B]
    running = torch.zeros_like(r_t[0])  # [B]
    for t in range(r_t.shape[0] - 1, -1, -1):
        m = m_t[t]  # [B]
        running = (r_t[t] + gamma * running) * m + (1.0 - m) * running  # [B]
        adv_t[t] = running * m
    return _out(rearrange(adv_t, "t b -> b t"), mask, params.whiten)


def _out(advantages: Tensor, mask: Tensor, whiten: bool) -> AdvantageOutput:
    """Returns are the un-whitened advantages (the discounted reverse-KL return; no critic reads them)."""
    returns = advantages.clone()  # [B, T]
    if whiten:
        advantages = masked_whiten(advantages, mask) * mask  # [B, T]
    return AdvantageOutput(advantages=advantages, returns=returns)


def k1_score_function(log_probs: Tensor, ref_log_probs: Tensor, params: ScoreFunctionK1Params) -> Tensor:
    """``sg(d) * exp(log p - sg(log p))``, ``d = log p - log q``: value ``d``, gradient ``d * grad log p``."""
    d = (log_probs - ref_log_probs).detach()  # [B, T]
    return d * torch.exp(log_probs - log_probs.detach())  # [B, T]


def generalized_jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> Tensor:
    """GKD's generalized JSD per token, summed over the vocabulary: ``[..., V] -> [...]``.

    With ``p_S = softmax(student / tau)``, ``p_T = softmax(teacher / tau)`` and the mixture
    ``M = beta * p_T + (1 - beta) * p_S``:
    ``JSD_beta = beta * KL(p_T || M) + (1 - beta) * KL(p_S || M)``; ``beta = 0`` is the forward
    ``KL(p_T || p_S)`` and ``beta = 1`` the reverse ``KL(p_S || p_T)`` (TRL's convention, whose
    ``generalized_jsd_loss`` is the masked mean of this). Agarwal et al. 2024, "On-Policy
    Distillation of Language Models: Learning from Self-Generated Mistakes" (GKD), Eq. 1,
    https://arxiv.org/abs/2306.13649.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"generalized_jsd: beta must be in [0, 1], got {beta}")
    log_s = torch.log_softmax(student_logits.float() / temperature, dim=-1)  # [..., V]
    log_t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)  # [..., V]
    if beta == 0.0:
        return _kl(log_t, log_s)  # [...] KL(p_T || p_S)
    if beta == 1.0:
        return _kl(log_s, log_t)  # [...] KL(p_S || p_T)
    log_m = torch.logsumexp(
        torch.stack([log_s + math.log1p(-beta), log_t + math.log(beta)]), dim=0
    )  # [..., V] log of the mixture
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)  # [...]


class GKDLoss:
    """GKD's loss (:class:`rlzoo.kernel.protocols.TeacherDivergenceLoss`): :meth:`divergence` is what
    the train backend computes per position in the update's forward, the call aggregates it."""

    def __call__(self, inputs: PolicyLossInputs, params: GKDParams) -> PolicyLossOutput:
        """``agg(JSD_beta)`` over the response tokens (``inputs.teacher_divergence`` ``[B, T]``)."""
        if inputs.teacher_divergence is None:
            raise ValueError(
                "gkd: inputs.teacher_divergence is None; the train backend computes it when the policy loss "
                "declares needs_teacher_distribution (a backend with supplies_teacher_divergence, and "
                "algorithm.teacher)"
            )
        loss = inputs.agg(inputs.teacher_divergence, inputs.response_mask)  # []
        return PolicyLossOutput(loss=loss, metrics={"gkd_jsd": loss.detach()})

    def divergence(self, student_logits: Tensor, teacher_logits: Tensor, params: GKDParams) -> Tensor:
        """:func:`generalized_jsd` with the params' beta and temperature: ``[..., V] x [..., V] -> [...]``."""
        return generalized_jsd(
            student_logits, teacher_logits, beta=params.beta, temperature=params.temperature
        )


gkd_loss = GKDLoss()


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``KL(p || q) = sum_v p_v (log p_v - log q_v)`` over the last axis: ``[..., V] -> [...]``."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)
