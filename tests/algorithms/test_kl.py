"""KL estimators, straight-through variants, controllers and the reward penalty."""

from __future__ import annotations

import math

import pytest
import torch

import rlzoo
from rlzoo.train_kit.formulas import AdaptiveKLController, FixedKLController, apply_kl_penalty

LOG2 = math.log(2.0)


def call(name, lp, ref):
    comp = rlzoo.get_plugin_manager().registry("kl").get(name)
    return comp.load()(lp, ref, comp.default_params())


# p = .5, p_ref = .25 -> d = log p - log p_ref = log 2
LP = torch.tensor([[math.log(0.5)]])
REF = torch.tensor([[math.log(0.25)]])


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("k1", LOG2),  # d
        ("kl", LOG2),
        ("abs", LOG2),  # |d|
        ("k2", 0.5 * LOG2**2),  # d^2 / 2 = .2402
        ("mse", 0.5 * LOG2**2),
        ("k3", 0.5 + LOG2 - 1),  # exp(-d) + d - 1 = p_ref/p - log(p_ref/p) - 1 = .5 + .6931 - 1
        ("low_var_kl", 0.5 + LOG2 - 1),
    ],
)
def test_values(name, want):
    torch.testing.assert_close(call(name, LP, REF), torch.tensor([[want]]))


def test_abs_of_negative_difference():
    # p = .25, p_ref = .5: k1 = -log 2, abs = log 2
    torch.testing.assert_close(call("k1", REF, LP), torch.tensor([[-LOG2]]))
    torch.testing.assert_close(call("abs", REF, LP), torch.tensor([[LOG2]]))


def test_k3_clamps_like_verl():
    lp = torch.tensor([0.0, -30.0])
    ref = torch.tensor([-30.0, 0.0])
    # first: log(p_ref/p) = -30 -> clamped to -20: exp(-20) + 20 - 1 = 19.000... -> clamped to 10
    # second: log(p_ref/p) = 30 -> clamped to 20: exp(20) - 21 -> clamped to 10
    torch.testing.assert_close(call("k3", lp, ref), torch.tensor([10.0, 10.0]))


@pytest.mark.parametrize(
    ("plus", "base"), [("k3+", "k3"), ("low_var_kl+", "k3"), ("k1+", "k1"), ("abs+", "abs")]
)
def test_straight_through_value_of_base_gradient_of_k2(plus, base):
    lp = torch.tensor([math.log(0.5), math.log(0.9), -2.0], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.3), -1.0])
    out = call(plus, lp, ref)
    torch.testing.assert_close(out.detach(), call(base, lp.detach(), ref))
    out.sum().backward()
    # d/dlp of (lp - ref)^2 / 2 = lp - ref
    torch.testing.assert_close(lp.grad, (lp - ref).detach())


def test_k2_plus_is_k2():
    assert rlzoo.get_plugin_manager().registry("kl").get("k2+").name == "k2"


def test_adaptive_controller_matches_ziegler_rule():
    c = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    c.update(current_kl=9.0, n_steps=1000)
    # error 9/6 - 1 = .5 clipped to .2 -> x (1 + .2 * 1000 / 10000) = x 1.02
    assert c.value == pytest.approx(0.102)
    c.update(current_kl=3.0, n_steps=1000)
    # error -.5 clipped to -.2 -> x .98
    assert c.value == pytest.approx(0.102 * 0.98)
    c.update(current_kl=6.6, n_steps=500)
    # error .1 -> x (1 + .1 * .05)
    assert c.value == pytest.approx(0.102 * 0.98 * 1.005)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, 6.0, 0)


def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(100.0, 10)
    assert c.value == 0.05


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, metrics = apply_kl_penalty(scores, kl, mask, coef=0.5)
    # scores - .5 * kl on the mask; the padded 9.0 is ignored
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 0.75, 0.0]]))
    # per-sequence means .2 and .45 -> .325
    assert metrics["reward_kl_penalty"] == pytest.approx(0.325)
    assert metrics["reward_kl_penalty_coeff"] == 0.5


def test_apply_kl_penalty_fully_masked_row_is_finite():
    _, metrics = apply_kl_penalty(torch.zeros(2, 2), torch.ones(2, 2), torch.tensor([[1.0, 1], [0, 0]]), 1.0)
    assert metrics["reward_kl_penalty"] == pytest.approx(0.5)  # (1 + 0) / 2


def test_registration():
    reg = rlzoo.get_plugin_manager().registry("kl")
    assert set(reg.names()) == {"k1", "abs", "k2", "k3", "k1+", "abs+", "k3+", "full", "k1_sf"}
    for comp in reg:
        # the estimators against the reference policy; k1_sf (rlzoo.algorithms.distill) is the teacher's term
        assert comp.capability("needs_reference") is (comp.plugin == "rlzoo.algorithms.kl")
        assert comp.summary
        comp.load()
    assert reg.get("low_var_kl").name == "k3" and reg.get("low_var_kl+").name == "k3+"


def test_full_is_the_exact_kl_over_the_vocabulary():
    # p = (.5, .5), p_ref = (.25, .75): KL = .5 log(.5 / .25) + .5 log(.5 / .75) = .5 log 2 + .5 log(2/3)
    p = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64).log()
    q = torch.tensor([[[0.25, 0.75]]], dtype=torch.float64).log()
    out = call("full", p, q)
    assert out.shape == (1, 1)
    torch.testing.assert_close(out, torch.tensor([[0.5 * LOG2 + 0.5 * math.log(2 / 3)]], dtype=torch.float64))
    assert call("full", p, p).abs().max() < 1e-12
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        call("full", LP, REF)
