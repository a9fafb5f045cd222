"""Rollout corrections: IS weights, IcePop, rejection, modes and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.protocols import CorrectionInputs

# row 0: p_old = .5, .5 and p_rollout = .25, 1.0 -> ratios 2, .5 (product 1)
# row 1: p_old = .9, .9 and p_rollout = .3, .9 -> ratios 3, 1 (product 3); third token is padding
L = math.log
OLD = torch.tensor([[L(0.5), L(0.5), 0.0], [L(0.9), L(0.9), -7.0]])
ROLL = torch.tensor([[L(0.25), L(1.0), 0.0], [L(0.3), L(0.9), 3.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def call(name, old=OLD, roll=ROLL, mask=MASK, **kw):
    comp = rlzoo.get_plugin_manager().registry("rollout_correction").get(name)
    return comp.load()(CorrectionInputs(old, roll, mask), comp.params(**kw))


def test_none():
    out = call("none")
    assert out.weights is None and out.mask is MASK and out.mode == "decoupled"
    assert call("none", mode="bypass").mode == "bypass"


def test_token_is_truncated():
    out = call("token_is", threshold=1.5)
    # ratios 2, .5 / 3, 1 -> truncated at 1.5; padding 0
    torch.testing.assert_close(out.weights, torch.tensor([[1.5, 0.5, 0.0], [1.5, 1.0, 0.0]]))
    assert torch.equal(out.mask, MASK)
    m = out.metrics
    # before truncation: 2 of 4 tokens above 1.5; max 3, min .5, mean (2 + .5 + 3 + 1) / 4
    torch.testing.assert_close(m["rollout_corr/is_ratio_fraction_high"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/is_max"], torch.tensor(3.0))
    torch.testing.assert_close(m["rollout_corr/is_min"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/is_mean"], torch.tensor(6.5 / 4))


def test_seq_is_is_product_of_ratios():
    out = call("seq_is", threshold=2.0)
    # row 0: 2 * .5 = 1; row 1: 3 * 1 = 3 -> truncated to 2
    torch.testing.assert_close(out.weights, torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 0.0]]))
    out = call("seq_is", threshold=None)
    torch.testing.assert_close(out.weights, torch.tensor([[1.0, 1.0, 0.0], [3.0, 3.0, 0.0]]))


def test_batch_normalize_gives_mean_one():
    out = call("token_is", threshold=None, batch_normalize=True)
    # ratios 2, .5, 3, 1 -> mean 1.625
    torch.testing.assert_close(out.weights, torch.tensor([[2, 0.5, 0], [3, 1, 0]]) / 1.625)


def test_icepop_masks_outside_range_and_weights_the_rest():
    out = call("icepop", low=0.5, high=2.5)
    # ratios 2, .5 kept (bounds inclusive); 3 masked; 1 kept
    assert out.mask.tolist() == [[1, 1, 0], [0, 1, 0]]
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.0], [0.0, 1.0, 0.0]]))
    torch.testing.assert_close(out.metrics["rollout_corr/masked_fraction"], torch.tensor(0.25))
    torch.testing.assert_close(out.metrics["rollout_corr/seq_masked_fraction"], torch.tensor(0.5))
    assert call("icepop", low=0.5, high=2.5, apply_weights=False).weights is None


def test_rejection_seq_mean_k3():
    # k3 = r - 1 - log r: r=2: 1 - .6931 = .3069; r=.5: -.5 + .6931 = .1931 -> row mean .25
    # r=3: 2 - 1.0986 = .9014; r=1: 0 -> row mean .4507
    out = call("rejection", metric="k3", agg="seq_mean", threshold=0.3)
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert out.weights is None
    assert call("rejection", metric="k3", agg="seq_mean", threshold=0.5).mask.tolist() == MASK.tolist()
    # token level: .3069 > .3 rejects the first token of row 0 as well
    out = call("rejection", metric="k3", agg="token", threshold=0.3)
    assert out.mask.tolist() == [[0, 1, 0], [0, 1, 0]]


def test_rejection_k1_ratio_bounds_and_k2_max():
    # seq_sum k1: sequence ratios 1 (kept) and 3 (outside [.5, 2])
    out = call("rejection", metric="k1", agg="seq_sum", ratio_low=0.5, ratio_high=2.0)
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    # seq_mean k1: geometric means 1 and sqrt(3) = 1.73 -> both inside [.5, 2]
    out = call("rejection", metric="k1", agg="seq_mean", ratio_low=0.5, ratio_high=2.0)
    assert out.mask.tolist() == MASK.tolist()
    # seq_max k2: row 0 max .5 * log(2)^2 = .24; row 1 max .5 * log(3)^2 = .60
    out = call("rejection", metric="k2", agg="seq_max", threshold=0.3)
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError):
        call("rejection", metric="k1", agg="seq_max")
    with pytest.raises(ValueError):
        call("rejection", metric="k4")


def test_rejection_with_is_weights_zero_on_rejected():
    out = call("rejection", metric="k3", agg="seq_mean", threshold=0.3, is_level="token", is_threshold=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.0], [0.0, 0.0, 0.0]]))


def test_bypass_mode_returns_no_weights_but_keeps_rejection():
    out = call("token_is", mode="bypass")
    assert out.weights is None and out.mode == "bypass"
    out = call("rejection", threshold=0.3, mode="bypass")
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="mode"):
        call("token_is", mode="sideways")


def test_diagnostic_metrics():
    m = call("token_is").metrics
    # |p_rollout - p_old|: .25, .5, .6, 0 -> mean .3375, max .6
    torch.testing.assert_close(m["rollout_corr/rollout_probs_diff_mean"], torch.tensor(0.3375))
    torch.testing.assert_close(m["rollout_corr/rollout_probs_diff_max"], torch.tensor(0.6))
    # kl = mean(log p_rollout - log p_old) = -(log 2 + log .5 + log 3 + 0) / 4 = -log(3) / 4
    torch.testing.assert_close(m["rollout_corr/kl"], torch.tensor(-math.log(3) / 4))
    # k3_kl = mean(r - 1 - log r) = (.3069 + .1931 + .9014 + 0) / 4 = (2 + .5 + 3 + 1 - 4 - log 3) / 4
    torch.testing.assert_close(m["rollout_corr/k3_kl"], torch.tensor((2.5 - math.log(3)) / 4))
    # training ppl per sequence: exp(-log .5) = 2 and exp(-log .9) = 1.111 -> mean 1.5556
    torch.testing.assert_close(m["rollout_corr/training_ppl"], torch.tensor((2 + 1 / 0.9) / 2))
    # rollout ppl: exp(-(log .25 + log 1)/2) = 2; exp(-(log .3 + log .9)/2) = 1/sqrt(.27)
    torch.testing.assert_close(m["rollout_corr/rollout_ppl"], torch.tensor((2 + 1 / math.sqrt(0.27)) / 2))
    # chi2_token = mean(r^2) - 1 = (4 + .25 + 9 + 1) / 4 - 1
    torch.testing.assert_close(m["rollout_corr/chi2_token"], torch.tensor(14.25 / 4 - 1))
    assert all(k.startswith("rollout_corr/") for k in m)


def test_weights_are_detached_and_fully_masked_rows_finite():
    old = OLD.clone().requires_grad_(True)
    mask = MASK.clone()
    mask[1] = 0
    for name in ["token_is", "seq_is", "icepop", "rejection"]:
        out = call(name, old=old, mask=mask)
        if out.weights is not None:
            assert not out.weights.requires_grad
            assert torch.equal(out.weights[1], torch.zeros(3))
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in out.metrics.values()), name


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_masked_positions_do_not_leak(seed):
    g = torch.Generator().manual_seed(seed)
    old, roll = -torch.rand(3, 5, generator=g) * 2, -torch.rand(3, 5, generator=g) * 2
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    noise = torch.randn(3, 5, generator=g) * 50 * (1 - mask)
    for name, kw in [("token_is", {}), ("seq_is", {}), ("icepop", {}), ("rejection", {"threshold": 0.05})]:
        a = call(name, old=old, roll=roll, mask=mask, **kw)
        b = call(name, old=old + noise, roll=roll - noise, mask=mask, **kw)
        assert torch.equal(a.mask, b.mask)
        if a.weights is not None:
            torch.testing.assert_close(a.weights, b.weights)
        for k in a.metrics:
            torch.testing.assert_close(a.metrics[k], b.metrics[k], msg=k)


def test_registration():
    reg = rlzoo.get_plugin_manager().registry("rollout_correction")
    assert set(reg.names()) == {"none", "token_is", "seq_is", "icepop", "rejection"}
    assert reg.get("seq_is").capability("sequence_level") is True
    assert reg.get("token_is").capability("needs_old_log_probs") is True
    assert reg.get("none").capability("needs_old_log_probs") is False
    for comp in reg:
        comp.load()
        assert comp.summary and all(f["help"] for f in comp.param_fields())
        assert comp.default_params().mode == "decoupled"
