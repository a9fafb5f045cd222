"""Rollout corrections: IS weights, IcePop, rejection, modes and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.kernel.protocols import CorrectionInputs

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
    # verl's names and values: raw ratios 2 and 3 are above 1.5 (2 of 4 tokens); max / min / mean are
    # of the applied (truncated) weights 1.5, .5, 1.5, 1
    torch.testing.assert_close(m["rollout_corr/rollout_is_ratio_fraction_high"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/rollout_is_max"], torch.tensor(1.5))
    torch.testing.assert_close(m["rollout_corr/rollout_is_min"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/rollout_is_mean"], torch.tensor(4.5 / 4))
    # ESS = 1 / mean((w / mean w)^2) on the applied weights clamped to [0, threshold]
    w = [1.5, 0.5, 1.5, 1.0]
    mean = sum(w) / 4
    ess = 1 / (sum((x / (mean + 1e-8)) ** 2 for x in w) / 4)
    torch.testing.assert_close(m["rollout_corr/rollout_is_eff_sample_size"], torch.tensor(ess))
    assert not any(k.startswith("rollout_corr/is_") for k in m), "verl's names are rollout_is_*"


def test_seq_is_metrics_follow_verl():
    m = call("seq_is", threshold=2.0).metrics
    # sequence ratios 1 and 3: max is of the raw sequence ratio, mean of the truncated weights per token
    torch.testing.assert_close(m["rollout_corr/rollout_is_max"], torch.tensor(3.0))
    torch.testing.assert_close(m["rollout_corr/rollout_is_min"], torch.tensor(1.0))
    torch.testing.assert_close(m["rollout_corr/rollout_is_mean"], torch.tensor(1.5))
    torch.testing.assert_close(m["rollout_corr/rollout_is_ratio_fraction_high"], torch.tensor(0.5))


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


def test_icepop_zeroes_weights_outside_range_and_keeps_the_mask():
    out = call("icepop", low=0.5, high=2.5)
    # ratios 2, .5 kept (bounds inclusive); 3 gets weight 0 but stays in the mask (verl); 1 kept
    assert torch.equal(out.mask, MASK)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.0], [0.0, 1.0, 0.0]]))
    torch.testing.assert_close(out.metrics["rollout_corr/rollout_is_oob_ratio"], torch.tensor(0.25))
    torch.testing.assert_close(out.metrics["rollout_corr/masked_fraction"], torch.tensor(0.0))
    gate = call("icepop", low=0.5, high=2.5, apply_weights=False).weights
    torch.testing.assert_close(gate, torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))


def test_icepop_gated_token_still_counts_in_token_mean():
    # token-mean of a unit loss weighted by the IcePop weights: the gated token adds 0 to the
    # numerator and 1 to the denominator, (2 + .5 + 0 + 1) / 4
    out = call("icepop", low=0.5, high=2.5)
    loss = (out.weights * out.mask).sum() / out.mask.sum()
    torch.testing.assert_close(loss, torch.tensor(3.5 / 4))


def test_rejection_seq_mean_k3():
    # k3 = r - 1 - log r: r=2: 1 - .6931 = .3069; r=.5: -.5 + .6931 = .1931 -> row mean .25
    # r=3: 2 - 1.0986 = .9014; r=1: 0 -> row mean .4507
    out = call("rejection", criteria="seq_mean_k3", thresholds="0.3")
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert out.weights is None
    assert call("rejection", criteria="seq_mean_k3", thresholds=0.5).mask.tolist() == MASK.tolist()
    # token level: .3069 > .3 rejects the first token of row 0 as well
    out = call("rejection", criteria="token_k3", thresholds="0.3")
    assert out.mask.tolist() == [[0, 1, 0], [0, 1, 0]]
    torch.testing.assert_close(out.metrics["rollout_corr/rollout_rs_masked_fraction"], torch.tensor(0.5))
    torch.testing.assert_close(
        out.metrics["rollout_corr/rollout_rs_token_k3_fraction_high"], torch.tensor(0.5)
    )


def test_rejection_k1_ratio_bounds_and_k2_max():
    # seq_sum k1: pi_rollout / pi_old per sequence 1 (kept) and 1/3 (outside [.5, 2])
    out = call("rejection", criteria="seq_sum_k1", thresholds="0.5_2.0")
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    # seq_mean k1: geometric means 1 and 1/sqrt(3) = .58 -> both inside [.5, 2]
    out = call("rejection", criteria="seq_mean_k1", thresholds="0.5_2.0")
    assert out.mask.tolist() == MASK.tolist()
    # a single k1 value u means [1/u, u]
    assert call("rejection", criteria="seq_sum_k1", thresholds="2").mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    # seq_max k2: row 0 max .5 * log(2)^2 = .24; row 1 max .5 * log(3)^2 = .60
    out = call("rejection", criteria="seq_max_k2", thresholds="0.3")
    assert out.mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="seq_max_k1"):
        call("rejection", criteria="seq_max_k1")
    with pytest.raises(ValueError, match="token_k1"):
        call("rejection", criteria="token_k4")
    with pytest.raises(ValueError, match="k1 criteria only"):
        call("rejection", criteria="token_k3", thresholds="0.1_0.3")
    with pytest.raises(ValueError, match="one per criterion"):
        call("rejection", criteria="token_k3,seq_mean_k2", thresholds="0.1,0.2,0.3")


def test_rejection_k1_bounds_pi_rollout_over_pi_old_like_verl():
    # token ratios pi_old / pi_rollout 2, .5 / 3, 1 -> pi_rollout / pi_old .5, 2 / .33, 1;
    # verl's token_k1 with bounds [.8, 2] keeps 2 and 1 (asymmetric bounds tell the two apart)
    out = call("rejection", criteria="token_k1", thresholds="0.8_2")
    assert out.mask.tolist() == [[0, 1, 0], [0, 1, 0]]


def test_rejection_chained_criteria_all_must_pass():
    # token_k1 [.8, 2] keeps [[0, 1], [0, 1]]; seq_mean_k3 <= .3 keeps row 0 only
    out = call("rejection", criteria="token_k1,seq_mean_k3", thresholds="0.8_2,0.3")
    assert out.mask.tolist() == [[0, 1, 0], [0, 0, 0]]
    m = out.metrics
    torch.testing.assert_close(m["rollout_corr/rollout_rs_token_k1_masked_fraction"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"], torch.tensor(0.5))
    torch.testing.assert_close(m["rollout_corr/rollout_rs_masked_fraction"], torch.tensor(0.75))
    torch.testing.assert_close(m["rollout_corr/rollout_rs_seq_masked_fraction"], torch.tensor(1.0))
    # duplicates are dropped, one shared threshold applies to every criterion
    same = call("rejection", criteria="token_k3, token_k3", thresholds="0.3")
    assert same.mask.tolist() == call("rejection", criteria="token_k3", thresholds="0.3").mask.tolist()


def test_token_veto_rejects_whole_responses():
    # row 0 holds a token with ratio .5 < .6: the whole response goes; row 1 (3, 1) stays
    for name, kw in [("token_is", {}), ("seq_is", {}), ("icepop", {}), ("rejection", {"thresholds": "1"})]:
        out = call(name, token_veto_threshold=0.6, **kw)
        assert out.mask.tolist() == [[0, 0, 0], [1, 1, 0]], name
        torch.testing.assert_close(out.metrics["rollout_corr/rollout_is_veto_fraction"], torch.tensor(0.5))
        torch.testing.assert_close(
            out.metrics["rollout_corr/rollout_is_catastrophic_token_fraction"], torch.tensor(0.25)
        )
        if out.weights is not None:
            assert (out.weights[0] == 0).all()
    assert call("token_is", token_veto_threshold=0.4).mask.tolist() == MASK.tolist()


def test_rejection_with_is_weights_zero_on_rejected():
    out = call("rejection", criteria="seq_mean_k3", thresholds="0.3", is_level="token", is_threshold=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.0], [0.0, 0.0, 0.0]]))


def test_bypass_mode_returns_no_weights_but_keeps_rejection():
    out = call("token_is", mode="bypass")
    assert out.weights is None and out.mode == "bypass"
    out = call("rejection", thresholds="0.3", mode="bypass")
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
    for name, kw in [("token_is", {}), ("seq_is", {}), ("icepop", {}), ("rejection", {"thresholds": "0.05"})]:
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
