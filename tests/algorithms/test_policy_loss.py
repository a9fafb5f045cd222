"""Policy losses: values worked out by hand on tiny batches, zero gradients where the formula
clips, invariance to masked values and to the micro-batch split, and registration."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import rlzoo
from rlzoo.algorithms import policy_loss as P
from rlzoo.algorithms.functional import loss_agg as A
from rlzoo.algorithms.functional import policy_loss as F
from rlzoo.kernel.protocols import PolicyLossInputs
from rlzoo.train_kit.formulas import make_agg_context

D = torch.float64
AGGS = {"token-mean": A.token_mean, "seq-mean-token-mean": A.seq_mean_token_mean}
LOSSES = {
    "ppo_clip": (F.ppo_clip, P.PPOClipParams()),
    "dro": (F.dro, P.DROParams()),
    "gspo": (F.gspo, P.GSPOParams()),
    "cispo": (F.cispo, P.CISPOParams()),
    "sapo": (F.sapo, P.SAPOParams()),
    "gpg": (F.gpg, P.GPGParams()),
    "geo_mean": (F.geo_mean, P.GeoMeanParams()),
    "dppo_tv": (F.dppo_tv, P.DPPOTVParams()),
    "dppo_kl": (F.dppo_kl, P.DPPOKLParams()),
    "clip_cov": (F.clip_cov, P.ClipCovParams()),
    "kl_cov": (F.kl_cov, P.KLCovParams()),
    "nll": (F.nll, P.NLLParams()),
}
#: losses whose value is a sum of per-token terms with no micro-batch statistics
SPLIT_INVARIANT = ["ppo_clip", "gspo", "cispo", "sapo", "gpg", "geo_mean", "dppo_tv", "dppo_kl", "nll"]
LN = math.log


def t(x):
    return torch.tensor(x, dtype=D)


def make(log_probs, old, adv, mask, agg="token-mean", weights=None, ctx_mask=None):
    lp = t(log_probs).requires_grad_(True)
    mask_t = torch.tensor(mask)
    ctx = make_agg_context(mask_t if ctx_mask is None else ctx_mask)
    inputs = PolicyLossInputs(
        log_probs=lp,
        old_log_probs=t(old),
        advantages=t(adv),
        response_mask=mask_t,
        agg=A.bind_agg(AGGS[agg], ctx, None),
        rollout_is_weights=None if weights is None else t(weights),
    )
    return inputs, lp


def grad(out, lp):
    (g,) = torch.autograd.grad(out.loss, lp)
    return g


# ---------------------------------------------------------------------------------------------
# ppo_clip
# ---------------------------------------------------------------------------------------------
# old log-probs 0, so r = exp(log_probs). eps_low = eps_high = 0.2, c = 3.
# row 0, A = +1, r = [1.1, 1.5, 0.5]:   max(-r, -clip(r)) = [-1.1, -1.2 (clipped), -0.5]
# row 1, A = -1, r = [0.5, 4.0, (masked)]: max(r, clip(r)) = [0.8 (clipped), 4.0] and the dual
#   clip min(., -A c = 3) = [0.8, 3.0 (dual-clipped)]
PPO_LP = [[LN(1.1), LN(1.5), LN(0.5)], [LN(0.5), LN(4.0), 0.0]]
PPO_ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
PPO_MASK = [[1, 1, 1], [1, 1, 0]]
ZEROS = [[0.0] * 3, [0.0] * 3]


def test_ppo_clip_hand_values():
    inputs, lp = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK)
    out = F.ppo_clip(inputs, P.PPOClipParams())
    # token-mean over 5 tokens: (-1.1 - 1.2 - 0.5 + 0.8 + 3.0) / 5 = 1.0 / 5
    assert out.loss.item() == pytest.approx(0.2)
    # clipped by the ratio clip: row0 t1, row1 t0 -> 2/5; dual-clipped: row1 t1 -> 1/5
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.4)
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(0.2)
    # ppo_kl = mean(old - new) = -log(1.1 * 1.5 * 0.5 * 0.5 * 4) / 5 = -log(1.65) / 5
    assert out.metrics["ppo_kl"].item() == pytest.approx(-LN(1.65) / 5)
    # d(-A r)/d log pi = -A r on unclipped tokens, / 5 tokens; clipped and dual-clipped: 0
    expected = t([[-1.1 / 5, 0.0, -0.5 / 5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(grad(out, lp), expected)


def test_ppo_clip_seq_mean_token_mean():
    inputs, _ = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK, agg="seq-mean-token-mean")
    out = F.ppo_clip(inputs, P.PPOClipParams())
    # row means: -2.8 / 3 and 3.8 / 2; their mean
    assert out.loss.item() == pytest.approx((-2.8 / 3 + 1.9) / 2)


def test_ppo_clip_clip_higher():
    # eps_high = 0.6: r = 1.5 is no longer clipped -> row 0 = [-1.1, -1.5, -0.5]
    inputs, _ = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK)
    out = F.ppo_clip(inputs, P.PPOClipParams(clip_ratio_high=0.6))
    assert out.loss.item() == pytest.approx((-1.1 - 1.5 - 0.5 + 0.8 + 3.0) / 5)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.2)


def test_ppo_clip_dual_clip_bound():
    # A = -2, r = 10: unclipped loss 20, dual clip caps it at -A c = 2 * 3 = 6; gradient 0.
    # A = -2, r = 2: 4 < 6, the dual clip is inactive and the gradient is -A r = 4.
    inputs, lp = make([[LN(10.0), LN(2.0)]], [[0.0, 0.0]], [[-2.0, -2.0]], [[1, 1]])
    out = F.ppo_clip(inputs, P.PPOClipParams(clip_ratio_c=3.0))
    assert out.loss.item() == pytest.approx((6.0 + 4.0) / 2)
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(0.5)
    torch.testing.assert_close(grad(out, lp), t([[0.0, 4.0 / 2]]))


def test_ppo_clip_ratio_exactly_at_the_boundary():
    # r = exp(0.15) and eps_high = r - 1 exactly: the clipped and unclipped terms are equal, the
    # token does not count as clipped and keeps its full gradient -A r.
    r = math.exp(0.15)
    inputs, lp = make([[0.15]], [[0.0]], [[1.0]], [[1]])
    out = F.ppo_clip(inputs, P.PPOClipParams(clip_ratio_high=r - 1.0))
    assert out.loss.item() == pytest.approx(-r)
    assert out.metrics["pg_clipfrac"].item() == 0.0
    torch.testing.assert_close(grad(out, lp), t([[-r]]))


def test_ppo_clip_rollout_is_weights():
    # per-token losses [-1.1, -1.2, -0.5 | 0.8, 3.0] times w = [2, 1, 1 | 1, 0.5]:
    # (-2.2 - 1.2 - 0.5 + 0.8 + 1.5) / 5 = -1.6 / 5; the masked weight 7 is ignored
    inputs, _ = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK, weights=[[2.0, 1.0, 1.0], [1.0, 0.5, 7.0]])
    out = F.ppo_clip(inputs, P.PPOClipParams())
    assert out.loss.item() == pytest.approx(-0.32)


def test_ppo_clip_log_ratio_clamped():
    # log r = 50 is clamped to 20 (verl): with A = -1 the dual clip gives loss 3 (finite)
    inputs, _ = make([[50.0]], [[0.0]], [[-1.0]], [[1]])
    out = F.ppo_clip(inputs, P.PPOClipParams())
    assert out.loss.item() == pytest.approx(3.0)
    assert out.metrics["ppo_kl"].item() == pytest.approx(-20.0)


def test_ppo_params_validated():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        P.PPOClipParams(clip_ratio_c=1.0)
    with pytest.raises(ValueError):
        P.PPOClipParams(clip_ratio_low=-0.1)


@pytest.mark.parametrize("name", [n for n, (_, p) in LOSSES.items() if hasattr(p, "clip_ratio_low")])
@pytest.mark.parametrize("field", ["clip_ratio_low", "clip_ratio_high"])
def test_every_clipped_loss_refuses_a_negative_clip_bound(name, field):
    # the clipped params share one check (ClipBounds); a loss whose own __post_init__ forgot to
    # call it would accept -0.1 here
    cls = type(LOSSES[name][1])
    assert issubclass(cls, P.ClipBounds)
    with pytest.raises(ValueError, match="clip_ratio_low / clip_ratio_high must be >= 0"):
        cls(**{field: -0.1})


# ---------------------------------------------------------------------------------------------
# gspo
# ---------------------------------------------------------------------------------------------
def test_gspo_hand_values_and_gradient():
    # row 0: log r = [0.1, 0.2, 0.3], A = +1: s = exp(0.2) = 1.2214 > 1.2 -> clipped, l = -1.2
    # row 1: log r = [-0.1, 0.0, (masked)], A = -1: s = exp(-0.05) = 0.95123, in range, l = +s
    lp = [[0.1, 0.2, 0.3], [-0.1, 0.0, 5.0]]
    adv = [[1.0] * 3, [-1.0] * 3]
    inputs, lpt = make(lp, ZEROS, adv, PPO_MASK, agg="seq-mean-token-mean")
    out = F.gspo(inputs, P.GSPOParams(clip_ratio_low=0.2, clip_ratio_high=0.2))
    s1 = math.exp(-0.05)
    assert out.loss.item() == pytest.approx((-1.2 + s1) / 2)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(3 / 5)
    assert out.metrics["ppo_kl"].item() == pytest.approx(-(0.1 + 0.2 + 0.3 - 0.1) / 5)
    # sequence-level GSPO: d(-A s_1)/d log pi_t = -A s_1 / |y_1|, times 1/2 (mean over 2 seqs);
    # the clipped row 0 has no gradient
    expected = t([[0.0, 0.0, 0.0], [s1 / 4, s1 / 4, 0.0]])
    torch.testing.assert_close(grad(out, lpt), expected)


def test_gspo_length_one_is_ppo_clip():
    # a length-1 response: the sequence ratio is the token ratio
    lp, adv = [[0.3], [-0.5], [0.05]], [[1.0], [1.0], [-0.5]]
    mask, zeros = [[1], [1], [1]], [[0.0]] * 3
    for agg in AGGS:
        a, _ = make(lp, zeros, adv, mask, agg=agg)
        b, _ = make(lp, zeros, adv, mask, agg=agg)
        g = F.gspo(a, P.GSPOParams(clip_ratio_low=0.2, clip_ratio_high=0.2)).loss
        p = F.ppo_clip(b, P.PPOClipParams(clip_ratio_c=1e9)).loss
        assert g.item() == pytest.approx(p.item())


def test_gspo_does_not_override_the_aggregation():
    # the paper fixes seq-mean-token-mean; the selected aggregation is still the one used
    lp, adv = [[0.01, 0.02, 0.0], [0.0, 0.0, 0.0]], [[1.0] * 3, [2.0] * 3]
    mask = [[1, 1, 1], [1, 0, 0]]
    tm, _ = make(lp, ZEROS, adv, mask, agg="token-mean")
    sm, _ = make(lp, ZEROS, adv, mask, agg="seq-mean-token-mean")
    assert F.gspo(tm, P.GSPOParams()).loss.item() != pytest.approx(F.gspo(sm, P.GSPOParams()).loss.item())
    comp = rlzoo.get_plugin_manager().registry("policy_loss").get("gspo")
    assert comp.capability("fixed_aggregation") == "seq-mean-token-mean"
    assert comp.capability("sequence_level") is True


# ---------------------------------------------------------------------------------------------
# cispo, sapo, gpg
# ---------------------------------------------------------------------------------------------
def test_cispo_hand_values_and_gradient():
    inputs, lp = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK)
    out = F.cispo(inputs, P.CISPOParams())
    # l = -sg[clip(r, 0.8, 1.2)] A log pi
    # row 0 (A=1):  clip = [1.1, 1.2, 0.8]; row 1 (A=-1): clip = [0.8, 1.2]
    terms = [-1.1 * LN(1.1), -1.2 * LN(1.5), -0.8 * LN(0.5), 0.8 * LN(0.5), 1.2 * LN(4.0)]
    assert out.loss.item() == pytest.approx(sum(terms) / 5)
    # r != clip(r): 1.5, 0.5 (row 0), 0.5, 4.0 (row 1) -> 4/5
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.8)
    # every token keeps a gradient: -A sg[clip(r)] / 5
    expected = t([[-1.1 / 5, -1.2 / 5, -0.8 / 5], [0.8 / 5, 1.2 / 5, 0.0]])
    torch.testing.assert_close(grad(out, lp), expected)


def test_sapo_hand_values_and_gradient():
    # r = 1: gate = (4 / tau) sigmoid(0) = 2 / tau. A = +1 (tau_pos = 1): l = -2;
    # A = -1 (tau_neg = 1.05): l = +2 / 1.05.
    # d l / d log pi = -A (4/tau) sigma'(0) tau r = -A * 4 * 0.25 * 1 = -A.
    inputs, lp = make([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, -1.0]], [[1, 1]])
    out = F.sapo(inputs, P.SAPOParams(tau_pos=1.0, tau_neg=1.05))
    assert out.loss.item() == pytest.approx((-2.0 + 2.0 / 1.05) / 2)
    torch.testing.assert_close(grad(out, lp), t([[-0.5, 0.5]]))
    # r = e^0.5, A = 1, tau = 2: l = -(4/2) sigmoid(2 (e^0.5 - 1))
    inputs, _ = make([[0.5]], [[0.0]], [[1.0]], [[1]])
    sig = 1 / (1 + math.exp(-2 * (math.exp(0.5) - 1)))
    assert F.sapo(inputs, P.SAPOParams(tau_pos=2.0)).loss.item() == pytest.approx(-2 * sig)


def test_gpg_hand_values():
    # l = -A log pi: row 0: -[log 1.1, log 1.5, log 0.5]; row 1: [log 0.5, log 4]
    inputs, lp = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK)
    out = F.gpg(inputs, P.GPGParams())
    assert out.loss.item() == pytest.approx((-LN(1.1 * 1.5 * 0.5) + LN(0.5 * 4.0)) / 5)
    torch.testing.assert_close(grad(out, lp), t([[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]]))


def test_nll_hand_values_and_gradient():
    # l = -log pi on the 5 trained tokens, advantages ignored (PPO_ADV is not all 1):
    # token-mean: -(log 1.1 + log 1.5 + log 0.5 + log 0.5 + log 4) / 5 = -log(1.65) / 5;
    # d l / d log pi = -1/5 on every trained token, 0 on the masked one
    inputs, lp = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK)
    out = F.nll(inputs, P.NLLParams())
    assert out.loss.item() == pytest.approx(-LN(1.1 * 1.5 * 0.5 * 0.5 * 4.0) / 5)
    torch.testing.assert_close(grad(out, lp), t([[-0.2, -0.2, -0.2], [-0.2, -0.2, 0.0]]))
    assert out.metrics["nll"].item() == pytest.approx(-LN(1.65) / 5)
    # seq-mean-token-mean: row 0 -log(0.825) / 3, row 1 -log(2) / 2, their mean;
    # gradient -1/(2*3) on row 0's tokens, -1/(2*2) on row 1's
    inputs, lp = make(PPO_LP, ZEROS, PPO_ADV, PPO_MASK, agg="seq-mean-token-mean")
    out = F.nll(inputs, P.NLLParams())
    assert out.loss.item() == pytest.approx((-LN(0.825) / 3 - LN(2.0) / 2) / 2)
    torch.testing.assert_close(grad(out, lp), t([[-1 / 6, -1 / 6, -1 / 6], [-0.25, -0.25, 0.0]]))


def test_nll_equals_trl_sft_loss():
    """TRL's SFTTrainer (loss_type "nll") takes the model's causal-LM loss with labels -100 outside
    the completion / assistant mask, transformers' ForCausalLMLoss: mean cross-entropy over the
    labelled tokens. nll with token-mean on the same tokens is the same number and gradient."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    g = torch.Generator().manual_seed(0)
    B, L, V, P_len = 2, 7, 11, 3  # sequences of L tokens; the response is the last L - P_len
    logits = torch.randn(B, L, V, generator=g, dtype=torch.float32, requires_grad=True)
    ids = torch.randint(0, V, (B, L), generator=g)
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])  # [B, T] trained response tokens
    labels = torch.full((B, L), -100)
    labels[:, P_len:] = torch.where(mask.bool(), ids[:, P_len:], torch.tensor(-100))
    theirs = ForCausalLMLoss(logits, labels, vocab_size=V)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    # rlzoo's layout: log-probs of the response tokens, predicted from the position before each
    logp = torch.log_softmax(logits.float(), -1)[:, P_len - 1 : L - 1].gather(-1, ids[:, P_len:, None])[
        ..., 0
    ]
    ctx = make_agg_context(mask)
    inputs = PolicyLossInputs(
        log_probs=logp,
        old_log_probs=logp.detach(),
        advantages=torch.zeros_like(logp),
        response_mask=mask,
        agg=A.bind_agg(A.token_mean, ctx, None),
    )
    ours = F.nll(inputs, P.NLLParams()).loss
    (g_ours,) = torch.autograd.grad(ours, logits)
    assert abs(ours.item() - theirs.item()) <= 1e-6
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-7, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# geo_mean (GMPO)
# ---------------------------------------------------------------------------------------------
def test_geo_mean_hand_values_and_gradient():
    # eps = 0.4 on log r. row 0, A = +1, log r = [0.1, 0.6] -> clipped to [0.1, 0.4],
    #   R_0 = exp(0.25), L_0 = -exp(0.25).
    # row 1, A = -1, log r = [-0.6, 0.2]: sgn = -1, min(-d, -clip(d)) = min([0.6, -0.2], [0.4, -0.2])
    #   = [0.4, -0.2] -> d' = [-0.4, 0.2], R_1 = exp(-0.1), L_1 = +exp(-0.1).
    lp, adv = [[0.1, 0.6], [-0.6, 0.2]], [[1.0, 1.0], [-1.0, -1.0]]
    inputs, lpt = make(lp, [[0.0] * 2] * 2, adv, [[1, 1]] * 2, agg="seq-mean-token-mean")
    out = F.geo_mean(inputs, P.GeoMeanParams())
    assert out.loss.item() == pytest.approx((-math.exp(0.25) + math.exp(-0.1)) / 2)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.25)  # row 0 t1 (A > 0)
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # row 1 t0 (A < 0)
    # d L_0 / d log pi_00 = -exp(0.25) / 2 (mean over 2 tokens), / 2 sequences; clipped: 0
    # d L_1 / d log pi_11 = +exp(-0.1) / 2 / 2
    expected = t([[-math.exp(0.25) / 4, 0.0], [0.0, math.exp(-0.1) / 4]])
    torch.testing.assert_close(grad(out, lpt), expected)


def test_geo_mean_rollout_weights_are_geometric_per_sequence():
    # one sequence, log r = 0, A = 1: L = -1; w = [4, 1] -> geometric mean 2 -> L = -2
    w = [[4.0, 1.0]]
    inputs, _ = make([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1, 1]], agg="seq-mean-token-mean", weights=w)
    assert F.geo_mean(inputs, P.GeoMeanParams()).loss.item() == pytest.approx(-2.0, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# DPPO
# ---------------------------------------------------------------------------------------------
HALF = LN(0.5)


def test_dppo_tv_hand_values_and_gradient():
    # p_old = 0.5 everywhere; delta = 0.2.
    # row 0, A = +1, p = [0.8, 0.6]: p - p_old = [0.3, 0.1] -> keep [0, 1]
    # row 1, A = -1, p = [0.2, 0.4]: p - p_old = [-0.3, -0.1] -> keep [0, 1]
    # l = -A sg[min(r, 20)] log p * keep: r = p / 0.5
    lp = [[LN(0.8), LN(0.6)], [LN(0.2), LN(0.4)]]
    old = [[HALF, HALF], [HALF, HALF]]
    inputs, lpt = make(lp, old, [[1.0, 1.0], [-1.0, -1.0]], [[1, 1], [1, 1]])
    out = F.dppo_tv(inputs, P.DPPOTVParams())
    assert out.loss.item() == pytest.approx((-1.2 * LN(0.6) + 0.8 * LN(0.4)) / 4)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.5)
    assert out.metrics["pg_clipfrac_lower"].item() == 0.0
    torch.testing.assert_close(grad(out, lpt), t([[0.0, -1.2 / 4], [0.0, 0.8 / 4]]))
    # c = 1.1 truncates the kept r = 1.2 (row 0) -> 1.1; pg_clipfrac_lower counts it: 1/4
    inputs, _ = make(lp, old, [[1.0, 1.0], [-1.0, -1.0]], [[1, 1], [1, 1]])
    out = F.dppo_tv(inputs, P.DPPOTVParams(clip_ratio_c=1.1))
    assert out.loss.item() == pytest.approx((-1.1 * LN(0.6) + 0.8 * LN(0.4)) / 4)
    assert out.metrics["pg_clipfrac_lower"].item() == pytest.approx(0.25)


def test_dppo_kl_hand_values():
    # p_old = 0.5, A = +1. KL_b(p) = 0.5 log(0.5 / p) + 0.5 log(0.5 / (1 - p)):
    #   p = 0.8: 0.5 log(1 / 0.64 ... ) = 0.5 log(0.625 * 2.5) = 0.5 log 1.5625 = 0.2231 > 0.2: drop
    #   p = 0.6: 0.5 log(0.8333 * 1.25) = 0.0204 <= 0.2: keep
    #   p = 0.1: p <= p_old: keep whatever the KL (here 0.5 log(5 * 0.5556) = 0.511)
    lp = [[LN(0.8), LN(0.6), LN(0.1)]]
    inputs, _ = make(lp, [[HALF] * 3], [[1.0] * 3], [[1, 1, 1]])
    out = F.dppo_kl(inputs, P.DPPOKLParams())
    expected = (-1.2 * LN(0.6) - 0.2 * LN(0.1)) / 3
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------
# clip_cov / kl_cov
# ---------------------------------------------------------------------------------------------
def test_clip_cov_detaches_exactly_the_selected_tokens():
    # A = [3, -3, 0, 0] (mean 0), log pi = [0, -2, -1, -1] (mean -1): cov = [3, 3, 0, 0];
    # r = 1 (nothing PPO-clipped). Candidates (1 < cov < 5): t0, t1. clip_num = max(int(2e-4*4), 1) = 1
    lp, adv = [[0.0, -2.0, -1.0, -1.0]], [[3.0, -3.0, 0.0, 0.0]]
    inputs, lpt = make(lp, lp, adv, [[1, 1, 1, 1]])
    torch.manual_seed(0)
    out = F.clip_cov(inputs, P.ClipCovParams())
    # l = -A r * corr = [-3, 3, 0, 0] * corr: one of the first two is dropped -> +-3/4
    assert abs(out.loss.item()) == pytest.approx(0.75)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(0.25)
    g = grad(out, lpt)
    assert int((g[0, :2] == 0).sum()) == 1
    # ratio 0.5: both candidates dropped -> loss 0, no gradient
    inputs, lpt = make(lp, lp, adv, [[1, 1, 1, 1]])
    out = F.clip_cov(inputs, P.ClipCovParams(clip_cov_ratio=0.5))
    assert out.loss.item() == 0.0
    assert torch.all(grad(out, lpt) == 0)


def test_kl_cov_hand_values():
    # A = [3, -3, 0, 0], log pi = [1, -2, -1, -1] (mean -0.75): cov = [5.25, 3.75, 0, 0];
    # top max(1, int(4 * 2e-4)) = 1 token: t0, which gets + 1.0 * |log r|.
    # log r = [0.1, 0, 0, 0]: l = [-3 e^0.1 + 0.1, 3, 0, 0]
    lp, adv = [[1.0, -2.0, -1.0, -1.0]], [[3.0, -3.0, 0.0, 0.0]]
    inputs, _ = make(lp, [[0.9, -2.0, -1.0, -1.0]], adv, [[1, 1, 1, 1]])
    out = F.kl_cov(inputs, P.KLCovParams())
    assert out.loss.item() == pytest.approx((-3 * math.exp(0.1) + 0.1 + 3.0) / 4)
    assert out.metrics["ppo_kl_abs"].item() == pytest.approx(0.1 / 4)
    assert out.metrics["ppo_kl"].item() == pytest.approx(-0.1 / 4)


# ---------------------------------------------------------------------------------------------
# properties shared by every loss
# ---------------------------------------------------------------------------------------------
def _random_batch(b=6, t_=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(b, t_, generator=g, dtype=D) * 0.9 + 0.05)  # p_old in (0.05, 0.95)
    lp = old + 0.3 * torch.randn(b, t_, generator=g, dtype=D)
    lp = torch.clamp(lp, max=-1e-3)
    adv = torch.randn(b, 1, generator=g, dtype=D).expand(b, t_).clone()
    lengths = torch.tensor([5, 1, 0, 3, 5, 2][:b])  # a length-1 row, a fully masked row
    mask = (torch.arange(t_)[None, :] < lengths[:, None]).long()
    return lp, old, adv, mask


def _inputs(lp, old, adv, mask, agg, ctx_mask=None, weights=None):
    ctx = make_agg_context(mask if ctx_mask is None else ctx_mask)
    return PolicyLossInputs(lp, old, adv, mask, A.bind_agg(AGGS[agg], ctx, None), rollout_is_weights=weights)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("agg", list(AGGS))
def test_masked_positions_do_not_matter(name, agg):
    fn, params = LOSSES[name]
    lp, old, adv, mask = _random_batch()
    lp2, old2, adv2 = lp.clone(), old.clone(), adv.clone()
    pad = mask == 0
    lp2[pad], old2[pad], adv2[pad] = -7.0, -0.01, 1e3
    torch.manual_seed(0)
    a = fn(_inputs(lp, old, adv, mask, agg), params)
    torch.manual_seed(0)
    b = fn(_inputs(lp2, old2, adv2, mask, agg), params)
    assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-9, abs=1e-12)
    for k in a.metrics:
        assert b.metrics[k].item() == pytest.approx(a.metrics[k].item(), rel=1e-9, abs=1e-12), k


@pytest.mark.parametrize("name", SPLIT_INVARIANT)
@pytest.mark.parametrize("agg", list(AGGS))
def test_micro_batch_split_invariance(name, agg):
    fn, params = LOSSES[name]
    lp, old, adv, mask = _random_batch()
    w = torch.rand(lp.shape, generator=torch.Generator().manual_seed(3), dtype=D) + 0.5
    lp = lp.clone().requires_grad_(True)
    full = fn(_inputs(lp, old, adv, mask, agg, weights=w), params).loss
    (g_full,) = torch.autograd.grad(full, lp)
    for bounds in ([0, 1, 2, 3, 4, 5, 6], [0, 3, 6], [0, 1, 5, 6]):
        parts = [
            fn(
                _inputs(lp[a:b], old[a:b], adv[a:b], mask[a:b], agg, ctx_mask=mask, weights=w[a:b]), params
            ).loss
            for a, b in itertools.pairwise(bounds)
        ]
        total = sum(parts)
        assert total.item() == pytest.approx(full.item(), rel=1e-9, abs=1e-12), bounds
        (g_acc,) = torch.autograd.grad(total, lp)
        torch.testing.assert_close(g_acc, g_full)


@pytest.mark.parametrize("name", list(LOSSES))
def test_metrics_and_finite(name):
    fn, params = LOSSES[name]
    lp, old, adv, mask = _random_batch()
    lp = lp.clone().requires_grad_(True)
    out = fn(_inputs(lp, old, adv, mask, "token-mean"), params)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
        v = out.metrics[key]
        assert isinstance(v, torch.Tensor) and not v.requires_grad and v.dim() == 0
    (g,) = torch.autograd.grad(out.loss, lp)
    assert torch.isfinite(g).all()
    assert torch.all(g[mask == 0] == 0)


@pytest.mark.parametrize("name", list(LOSSES))
def test_all_masked_batch_gives_zero(name):
    fn, params = LOSSES[name]
    lp, old, adv, mask = _random_batch()
    mask = torch.zeros_like(mask)
    out = fn(_inputs(lp, old, adv, mask, "token-mean"), params)
    assert out.loss.item() == 0.0


def test_registration():
    reg = rlzoo.get_plugin_manager().registry("policy_loss")
    comp = reg.get("ppo_clip")
    assert comp.load() is F.ppo_clip
    assert isinstance(comp.default_params(), P.PPOClipParams)
    assert comp.capability("needs_old_log_probs") is True
    assert reg.get("vanilla") is comp  # verl's name
    assert set(LOSSES) <= set(reg.names())
    for name in LOSSES:
        c = reg.get(name)
        assert c.load() is LOSSES[name][0]
        assert c.summary
        assert all(f["help"] for f in c.param_fields())
    assert reg.get("sapo").capability("fixed_aggregation") == "seq-mean-token-mean"
    assert reg.get("geo_mean").capability("fixed_aggregation") == "seq-mean-token-mean"
    assert reg.get("gpg").capability("needs_old_log_probs") is False
    assert reg.get("nll").capability("needs_old_log_probs") is False


def test_dro_hand_worked():
    # pi = .5, pi_old = .25: log r = log 2; A = 2, beta = .5
    # l = -(A log pi - beta / 2 (log r)^2) = -(2 log .5 - .25 log(2)^2)
    # dl / dlog pi = -(A - beta log r) = -(2 - .5 log 2)
    inputs, lp = make([[math.log(0.5)]], [[math.log(0.25)]], [[2.0]], [[1.0]])
    out = F.dro(inputs, P.DROParams(beta=0.5))
    l2 = math.log(2.0)
    torch.testing.assert_close(out.loss, t(-(2 * math.log(0.5) - 0.25 * l2**2)))
    torch.testing.assert_close(grad(out, lp), t([[-(2 - 0.5 * l2)]]))
    torch.testing.assert_close(out.metrics["ppo_kl"], t(-l2))
    assert out.metrics["pg_clipfrac"] == 0
    with pytest.raises(ValueError, match="beta"):
        P.DROParams(beta=0.0)
