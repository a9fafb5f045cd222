"""Distillation objectives: values and gradients by hand, and TRL's generalized JSD (GKD)."""

from __future__ import annotations

import math

import pytest
import torch

import rlzoo
from rlzoo.algorithms.distill import ReverseKLAdvantageParams
from rlzoo.algorithms.functional.distill import generalized_jsd, k1_score_function, reverse_kl_advantage
from rlzoo.kernel.protocols import AdvantageInputs


def adv_inputs(student, teacher, mask):
    mask = torch.tensor(mask, dtype=torch.float32)
    return AdvantageInputs(
        token_level_rewards=torch.zeros_like(mask),
        response_mask=mask,
        old_log_probs=torch.tensor(student),
        teacher_log_probs=torch.tensor(teacher),
    )


def test_reverse_kl_advantage_is_minus_the_log_ratio_per_token():
    # A_t = -(log pi_s - log pi_T): -(-1 - -0.5) = +0.5 (the teacher likes it more), -(-2 - -2.5) = -0.5;
    # padding: 0
    inputs = adv_inputs([[-1.0, -2.0, -0.5]], [[-0.5, -2.5, -3.0]], [[1, 1, 0]])
    out = reverse_kl_advantage(inputs, ReverseKLAdvantageParams())
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, -0.5, 0.0]]))


def test_discount_skips_observation_tokens():
    # mask 1 0 1 1 (a model turn, an observation, a model turn);
    # r = -(s - T) = [-(-1 - -.5), -, -(-2 - -1), -(-1 - -1)] = [.5, -, 1, 0]
    # gamma .5, n counts trained tokens only: A_3 = 0; A_2 = 1 + .5 * 0 = 1;
    # A_0 = .5 + .5 * A_2 = 1.0 (the observation is no step); A_1 = 0 (masked)
    inputs = adv_inputs([[-1.0, -7.0, -2.0, -1.0]], [[-0.5, -0.1, -1.0, -1.0]], [[1, 0, 1, 1]])
    out = reverse_kl_advantage(inputs, ReverseKLAdvantageParams(gamma=0.5))
    torch.testing.assert_close(out.advantages, torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    # gamma 1: minus the log-ratio summed over the rest of the trajectory: A_0 = .5 + 1 + 0 = 1.5
    out = reverse_kl_advantage(inputs, ReverseKLAdvantageParams(gamma=1.0))
    torch.testing.assert_close(out.advantages, torch.tensor([[1.5, 0.0, 1.0, 0.0]]))


def test_reverse_kl_advantage_without_teacher_names_what_is_missing():
    inputs = adv_inputs([[-1.0]], [[-1.0]], [[1]])
    inputs.teacher_log_probs = None
    with pytest.raises(ValueError, match=r"teacher_log_probs.*algorithm\.teacher"):
        reverse_kl_advantage(inputs, ReverseKLAdvantageParams())


def test_registered_with_its_capabilities():
    pm = rlzoo.get_plugin_manager()
    adv = pm.registry("advantage").get("distill_reverse_kl")
    assert adv.caps.needs_teacher and adv.caps.needs_old_log_probs
    assert pm.registry("kl").get("k1_sf").load() is k1_score_function


def test_k1_score_function_value_and_gradient():
    # d = log p - log q = [-1 - -1.5, -2 - -1] = [0.5, -1.0]; value d, gradient d (w.r.t. log p)
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    q = torch.tensor([[-1.5, -1.0]])
    value = k1_score_function(lp, q, None)
    torch.testing.assert_close(value.detach(), torch.tensor([[0.5, -1.0]]))
    value.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.5, -1.0]]))


def test_k1_score_function_expected_gradient_is_the_reverse_kl_gradient():
    # over a 3-token categorical p = softmax(theta), the p-weighted estimator's gradient equals the
    # gradient of KL(p || q) = sum_y p_y (log p_y - log q_y), the published formula, from autograd
    theta = torch.tensor([0.3, -0.2, 1.1], requires_grad=True)
    log_q = torch.log_softmax(torch.tensor([0.0, 1.0, -1.0]), -1)
    log_p = torch.log_softmax(theta, -1)
    (log_p.exp() * (log_p - log_q)).sum().backward()
    want = theta.grad.clone()
    theta.grad = None
    log_p = torch.log_softmax(theta, -1)
    (log_p.exp().detach() * k1_score_function(log_p, log_q, None)).sum().backward()
    torch.testing.assert_close(theta.grad, want, atol=1e-7, rtol=0)


# p_S = [.5, .5] (logits 0, 0); p_T = [.75, .25] (logits log 3, 0)
_S = torch.tensor([[0.0, 0.0]])
_T = torch.tensor([[math.log(3.0), 0.0]])


@pytest.mark.parametrize(
    ("beta", "want"),
    [
        # beta 0: KL(p_T || p_S) = .75 ln(.75/.5) + .25 ln(.25/.5) = .30410 - .17329 = .13081
        (0.0, 0.75 * math.log(1.5) + 0.25 * math.log(0.5)),
        # beta 1: KL(p_S || p_T) = .5 ln(.5/.75) + .5 ln(.5/.25) = .14384
        (1.0, 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0)),
        # beta .5: M = [.625, .375]; .5 KL(p_T || M) + .5 KL(p_S || M) = .5 (.03537 + .03227) = .03382
        (
            0.5,
            0.5 * (0.75 * math.log(0.75 / 0.625) + 0.25 * math.log(0.25 / 0.375))
            + 0.5 * (0.5 * math.log(0.5 / 0.625) + 0.5 * math.log(0.5 / 0.375)),
        ),
    ],
)
def test_generalized_jsd_by_hand(beta, want):
    torch.testing.assert_close(generalized_jsd(_S, _T, beta=beta), torch.tensor([want]))


def test_generalized_jsd_gradient_by_hand():
    # beta 1: KL(p_S || p_T) w.r.t. the student's logits z: p_S * (log p_S - log p_T - KL), the
    # softmax Jacobian applied to log p_S - log p_T + 1; at p_S = [.5, .5]:
    # g_0 = .5 (ln(.5/.75) - .14384) = -.27465, g_1 = -g_0
    z = _S.clone().requires_grad_(True)
    generalized_jsd(z, _T, beta=1.0).sum().backward()
    kl = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0)
    g0 = 0.5 * (math.log(0.5 / 0.75) - kl)
    torch.testing.assert_close(z.grad, torch.tensor([[g0, -g0]]))


def test_generalized_jsd_refuses_beta_out_of_range():
    with pytest.raises(ValueError, match="beta must be in"):
        generalized_jsd(_S, _T, beta=1.5)


def _trl_gkd():
    pytest.importorskip("trl", reason="TRL is in the dev extra: pip install -e .[dev]")
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.gkd import GKDTrainer

    return GKDTrainer.generalized_jsd_loss


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generalized_jsd_matches_trl(beta, temperature):
    """Our per-token JSD, masked-mean over tokens, is TRL's ``generalized_jsd_loss`` (batchmean
    with -100 labels), in value and in the gradients of both logits, within 1e-6 in fp32."""
    trl_loss = _trl_gkd()
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, 11, generator=g) * 2
    t = torch.randn(3, 5, 11, generator=g) * 2
    mask = torch.rand(3, 5, generator=g) > 0.3  # [B, T]
    labels = torch.where(mask, torch.randint(0, 11, (3, 5), generator=g), -100)
    s1, t1 = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    want = trl_loss(s1, t1, labels=labels, beta=beta, temperature=temperature)
    want.backward()
    s2, t2 = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    per_token = generalized_jsd(s2, t2, beta=beta, temperature=temperature)  # [B, T]
    m = mask.float()
    got = (per_token * m).sum() / m.sum()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(s2.grad, s1.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(t2.grad, t1.grad, atol=1e-6, rtol=0)
