"""Advantage estimators: hand-worked values, verl edge cases, invariances, registration."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.algorithms import advantage as adv_mod
from rlzoo.algorithms.functional import advantage as F
from rlzoo.kernel.protocols import AdvantageInputs

# Two groups of three, interleaved, with non-contiguous ids (10 and 3):
#   group 10 = samples 0, 2, 4 with rewards 1, 2, 3 and lengths 4, 2, 1
#   group 3  = samples 1, 3, 5 with rewards 0, 0, 6 and lengths 3, 1, 2
IDS = torch.tensor([10, 3, 10, 3, 10, 3])
REWARDS = [1.0, 0.0, 2.0, 0.0, 3.0, 6.0]
LENGTHS = [4, 3, 2, 1, 1, 2]
T = 4


def make_inputs(rewards=REWARDS, lengths=LENGTHS, ids=IDS, t=T, **kw) -> AdvantageInputs:
    b = len(rewards)
    mask = torch.zeros(b, t)
    tlr = torch.zeros(b, t)
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        mask[i, :n] = 1
        tlr[i, max(n - 1, 0)] = r  # outcome reward on the last response token
    return AdvantageInputs(token_level_rewards=tlr, response_mask=mask, group_ids=ids, **kw)


def per_sample(out_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The (constant) advantage of each response, read on its first token."""
    assert torch.all(out_adv[mask == 0] == 0), "advantages must be zero where the mask is 0"
    return out_adv[:, 0]


def params(name: str, **kw):
    comp = rlzoo.get_plugin_manager().registry("advantage").get(name)
    return comp.params(**kw)


def call(name: str, inputs: AdvantageInputs, **kw):
    comp = rlzoo.get_plugin_manager().registry("advantage").get(name)
    return comp.load()(inputs, comp.params(**kw))


S12 = math.sqrt(12.0)  # group 3: mean 2, deviations -2, -2, 4 -> (4 + 4 + 16) / (3 - 1) = 12


# --------------------------------------------------------------------------- hand-worked values
def test_grpo_two_groups():
    inp = make_inputs()
    out = call("grpo", inp)
    # group 10: mean 2, std sqrt((1 + 0 + 1) / 2) = 1 -> (r - 2) / (1 + 1e-6)
    # group 3:  mean 2, std sqrt(12)                 -> (r - 2) / (sqrt(12) + 1e-6)
    e = 1e-6
    want = [-1 / (1 + e), -2 / (S12 + e), 0.0, -2 / (S12 + e), 1 / (1 + e), 4 / (S12 + e)]
    torch.testing.assert_close(per_sample(out.advantages, inp.response_mask), torch.tensor(want))
    assert out.returns is out.advantages or torch.equal(out.returns, out.advantages)
    # the advantage sits on every response token, zero on padding
    torch.testing.assert_close(out.advantages[4], torch.tensor([1 / (1 + e), 0, 0, 0]))


def test_dr_grpo_is_grpo_without_std():
    out = call("grpo", make_inputs(), norm_by_std=False)
    # r - group mean: group 10 -> -1, 0, 1; group 3 -> -2, -2, 4
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([-1.0, -2, 0, -2, 1, 4]))


def test_rloo():
    out = call("rloo", make_inputs())
    # r minus the mean of the other two: group 10: 1-(2+3)/2, 2-(1+3)/2, 3-(1+2)/2 = -1.5, 0, 1.5
    # group 3: 0-(0+6)/2, 0-(0+6)/2, 6-(0+0)/2 = -3, -3, 6
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([-1.5, -3, 0, -3, 1.5, 6]))


def test_opo_length_weighted_baseline():
    out = call("opo", make_inputs())
    # group 10: b = (4*1 + 2*2 + 1*3) / (4+2+1) = 11/7 -> 1-11/7, 2-11/7, 3-11/7
    # group 3:  b = (3*0 + 1*0 + 2*6) / (3+1+2) = 2   -> -2, -2, 4
    want = [1 - 11 / 7, -2.0, 2 - 11 / 7, -2.0, 3 - 11 / 7, 4.0]
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor(want))


def test_gpg():
    out = call("gpg", make_inputs())
    # 4 of the 6 rewards are non-zero -> alpha = 6 / 4 = 1.5; A = 1.5 * (r - mean)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([-1.5, -3, 0, -3, 1.5, 6]))


def test_grpo_passk():
    out = call("grpo_passk", make_inputs())
    # group 10: best is sample 4 (3), second 2 -> (3 - 2) / (1 + 1e-6)
    # group 3:  best is sample 5 (6), second 0 -> 6 / (sqrt(12) + 1e-6); everyone else 0
    want = [0.0, 0.0, 0.0, 0.0, 1 / (1 + 1e-6), 6 / (S12 + 1e-6)]
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor(want))
    out = call("grpo_passk", make_inputs(), norm_by_std=False)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([0.0, 0, 0, 0, 1, 6]))


def test_grpo_passk_tie_gives_zero_and_singleton_raises():
    out = call("grpo_passk", make_inputs(rewards=[1.0, 1.0], lengths=[1, 1], ids=torch.tensor([0, 0])))
    assert torch.equal(out.advantages, torch.zeros(2, T))  # r_max - r_second = 0
    with pytest.raises(ValueError, match="at least 2"):
        call("grpo_passk", make_inputs(rewards=[1.0], lengths=[1], ids=torch.tensor([5])))


def test_reinforce_plus_plus_baseline():
    inp = make_inputs()
    out = call("reinforce_plus_plus_baseline", inp)
    # r - group mean per sample: -1, -2, 0, -2, 1, 4, repeated over 4, 3, 2, 1, 1, 2 tokens (13)
    # sum = -4 - 6 + 0 - 2 + 1 + 8 = -3 -> mean -3/13; sum of squares = 4 + 12 + 0 + 4 + 1 + 32 = 53
    # unbiased var = (53 - 13 * (3/13)^2) / 12 = 680 / 156
    std = math.sqrt(680 / 156 + 1e-8)
    want = [(c + 3 / 13) / std for c in (-1, -2, 0, -2, 1, 4)]
    torch.testing.assert_close(per_sample(out.advantages, inp.response_mask), torch.tensor(want))


def test_reinforce_plus_plus_discounted_and_whitened():
    tlr = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = call("reinforce_plus_plus", AdvantageInputs(tlr, mask), gamma=0.5)
    # row 0: G2 = 1, G1 = 0 + .5*1 = .5, G0 = .25
    # row 1: t=2 is padding (reset, reward 5 does not flow back): G1 = 2, G0 = 0 + .5*2 = 1
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    # valid: .25 .5 1 1 2 -> mean .95, squared deviations .49 .2025 .0025 .0025 1.1025 = 1.8
    # unbiased var 1.8 / 4 = .45
    s = math.sqrt(0.45 + 1e-8)
    want = torch.tensor([[-0.7 / s, -0.45 / s, 0.05 / s], [0.05 / s, 1.05 / s, 0.0]])
    torch.testing.assert_close(out.advantages, want)


def test_reinforce_plus_plus_carries_return_through_masked_tokens():
    # a tool observation (tokens 1-2 masked) inside the response: verl carries the return through,
    # so the outcome reward reaches token 0 (the old reset gave [0, 0, 0, 1, 1])
    tlr = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    out = call("reinforce_plus_plus", AdvantageInputs(tlr, mask), gamma=1.0)
    assert out.returns.tolist() == [[1.0, 0.0, 0.0, 1.0, 1.0]]
    # gamma discounts over the unmasked tokens only: G4 = 1, G3 = .5, G0 = .25
    out = call("reinforce_plus_plus", AdvantageInputs(tlr, mask), gamma=0.5)
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.0, 0.0, 0.5, 1.0]], dtype=torch.float64))


def test_remax():
    tlr = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    inp = AdvantageInputs(tlr, mask, baseline_rewards=torch.tensor([0.25, 3.0]))
    out = call("remax", inp)
    # returns = reward-to-go: [1, 1, 1], [2, 2, 0]; advantages = returns - greedy reward (on the mask)
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1, 1], [2, 2, 0]]))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.75, 0.75, 0.75], [-1, -1, 0]]))
    with pytest.raises(ValueError, match="baseline_rewards"):
        call("remax", AdvantageInputs(tlr, mask))


def test_gae_hand_values():
    tlr = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    mask = torch.ones(1, 3)
    inp = AdvantageInputs(tlr, mask, values=values)
    out = call("gae", inp, gamma=0.5, lam=0.5, whiten=False)
    # t=2: delta = 1 - .5 = .5, A = .5
    # t=1: delta = 0 + .5*.5 - .5 = -.25, A = -.25 + .25*.5 = -.125
    # t=0: delta = -.25, A = -.25 + .25*(-.125) = -.28125; returns = A + V
    torch.testing.assert_close(out.advantages, torch.tensor([[-0.28125, -0.125, 0.5]]))
    torch.testing.assert_close(out.returns, torch.tensor([[0.21875, 0.375, 1.0]]))


def test_gae_skips_masked_tokens_and_whitens():
    # middle token masked (an observation token): its value and reward are ignored
    tlr = torch.tensor([[0.0, 7.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 0.5], [0.0, 0.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    out = call("gae", AdvantageInputs(tlr, mask, values=values), whiten=False)
    # row 0 (gamma = lam = 1): t=2: A = 1 - .5 = .5; t=1 masked: carries A = .5 and V_next = .5;
    #   t=0: delta = 0 + .5 - .5 = 0, A = 0 + .5 = .5
    # row 1: t=2 masked (carries zeros); t=1: A = 1 - 0 = 1; t=0: delta = 0 + 0 - 0, A = 1
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.0, 0.5], [1.0, 1.0, 0.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    w = call("gae", AdvantageInputs(tlr, mask, values=values)).advantages
    # valid values .5 .5 1 1: mean .75, unbiased var (4 * .0625) / 3 = 1/12
    s = math.sqrt(1 / 12 + 1e-8)
    torch.testing.assert_close(w, torch.tensor([[-0.25 / s, 0.0, -0.25 / s], [0.25 / s, 0.25 / s, 0.0]]))


# --------------------------------------------------------------------------- edge cases
def test_singleton_group_uses_mean_0_std_1_like_verl():
    inp = make_inputs(rewards=[0.5, 1.0, 3.0], lengths=[2, 1, 1], ids=torch.tensor([99, 5, 5]))
    e = 1e-6
    # group 99 has one response: mean 0, std 1 -> .5 / (1 + 1e-6); group 5: 1, 3 -> mean 2, std sqrt(2)
    want = [0.5 / (1 + e), -1 / (math.sqrt(2) + e), 1 / (math.sqrt(2) + e)]
    torch.testing.assert_close(call("grpo", inp).advantages[:, 0], torch.tensor(want))
    # rloo leaves a singleton's reward as is; rf++-baseline / gpg / opo use baseline 0
    torch.testing.assert_close(call("rloo", inp).advantages[:, 0], torch.tensor([0.5, -2.0, 2.0]))
    torch.testing.assert_close(call("opo", inp).advantages[0, 0], torch.tensor(0.5))
    # gpg: alpha = 3 / 3 = 1; singleton: 1 * (.5 - 0)
    torch.testing.assert_close(call("gpg", inp).advantages[:, 0], torch.tensor([0.5, -1.0, 1.0]))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
def test_all_equal_rewards_give_zero(name):
    inp = make_inputs(
        rewards=[1.0, 1.0, 1.0, 0.0, 0.0], lengths=[1, 2, 3, 1, 1], ids=torch.tensor([1, 1, 1, 2, 2])
    )
    out = call(name, inp)
    assert torch.isfinite(out.advantages).all()
    torch.testing.assert_close(out.advantages, torch.zeros_like(out.advantages))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"])
def test_fully_masked_row_is_zero_and_finite(name):
    inp = make_inputs()
    inp.response_mask[2] = 0  # e.g. rejected by rollout correction
    out = call(name, inp)
    assert torch.isfinite(out.advantages).all()
    assert torch.equal(out.advantages[2], torch.zeros(T))


def test_gae_and_reinforce_fully_masked_batch_is_finite():
    z = torch.zeros(2, 3)
    out = call("gae", AdvantageInputs(z, z, values=z))
    assert torch.equal(out.advantages, z)
    out = call("reinforce_plus_plus", AdvantageInputs(torch.ones(2, 3), z))
    assert torch.equal(out.advantages, z)


def test_length_one_responses():
    inp = make_inputs(rewards=[1.0, 0.0], lengths=[1, 1], ids=torch.tensor([4, 4]), t=1)
    # mean .5, std sqrt(.5) -> +-.5 / sqrt(.5)
    want = torch.tensor([[0.5 / (math.sqrt(0.5) + 1e-6)], [-0.5 / (math.sqrt(0.5) + 1e-6)]])
    torch.testing.assert_close(call("grpo", inp).advantages, want)
    out = call("reinforce_plus_plus", AdvantageInputs(torch.tensor([[3.0]]), torch.ones(1, 1)))
    assert torch.equal(out.advantages, torch.zeros(1, 1))  # one valid token: whitened to 0


def test_missing_group_ids_is_a_clear_error():
    inp = make_inputs()
    inp.group_ids = None
    with pytest.raises(ValueError, match="needs group_ids"):
        call("grpo", inp)


# --------------------------------------------------------------------------- verl reference (loops)
def _verl_grpo(scores, index, eps=1e-6, norm=True):
    """verl's compute_grpo_outcome_advantage, transcribed (dict of lists per group)."""
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    mean, std = {}, {}
    for k, v in id2score.items():
        t = torch.stack(v)
        mean[k], std[k] = (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else (t.mean(), t.std())
    out = scores.clone()
    for i in range(len(scores)):
        k = index[i]
        out[i] = (scores[i] - mean[k]) / (std[k] + eps) if norm else scores[i] - mean[k]
    return out


groups_strategy = st.lists(st.integers(0, 5), min_size=1, max_size=24)


@settings(max_examples=40, deadline=None)
@given(ids=groups_strategy, seed=st.integers(0, 2**16), norm=st.booleans())
def test_grpo_matches_verl_loop(ids, seed, norm):
    g = torch.Generator().manual_seed(seed)
    b = len(ids)
    scores = torch.randint(0, 3, (b,), generator=g).float()
    inp = make_inputs(rewards=scores.tolist(), lengths=[1] * b, ids=torch.tensor(ids) * 1000 + 7, t=1)
    got = call("grpo", inp, norm_by_std=norm).advantages[:, 0]
    torch.testing.assert_close(got, _verl_grpo(scores, ids, norm=norm), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(ids=groups_strategy, seed=st.integers(0, 2**16))
def test_permuting_samples_permutes_advantages(ids, seed):
    g = torch.Generator().manual_seed(seed)
    b = len(ids)
    rewards = torch.randn(b, generator=g).tolist()
    lengths = torch.randint(1, 5, (b,), generator=g).tolist()
    perm = torch.randperm(b, generator=g)
    base = make_inputs(rewards=rewards, lengths=lengths, ids=torch.tensor(ids), t=4)
    permuted = make_inputs(
        rewards=[rewards[i] for i in perm],
        lengths=[lengths[i] for i in perm],
        ids=torch.tensor(ids)[perm],
        t=4,
    )
    for name in ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"]:
        a = call(name, base).advantages
        p = call(name, permuted).advantages
        torch.testing.assert_close(p, a[perm], rtol=1e-4, atol=1e-5, msg=name)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), gamma=st.floats(0.5, 1.0), lam=st.floats(0.5, 1.0))
def test_masked_positions_do_not_leak(seed, gamma, lam):
    """Values / rewards on masked positions change nothing on unmasked ones (GAE, REINFORCE++)."""
    g = torch.Generator().manual_seed(seed)
    b, t = 3, 6
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 1
    tlr, values = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    noise = torch.randn(b, t, generator=g) * 100 * (1 - mask)
    a = call("gae", AdvantageInputs(tlr, mask, values=values), gamma=gamma, lam=lam)
    c = call("gae", AdvantageInputs(tlr + noise, mask, values=values - noise), gamma=gamma, lam=lam)
    torch.testing.assert_close(a.advantages, c.advantages)
    torch.testing.assert_close(a.returns, c.returns)
    a = call("reinforce_plus_plus", AdvantageInputs(tlr, mask), gamma=gamma)
    c = call("reinforce_plus_plus", AdvantageInputs(tlr + noise, mask), gamma=gamma)
    torch.testing.assert_close(a.advantages, c.advantages)


# --------------------------------------------------------------------------- registration
EXPECTED_CAPS = {
    "gae": {"needs_critic": True},
    "grpo": {"needs_group": True},
    "rloo": {"needs_group": True},
    "reinforce_plus_plus": {},
    "reinforce_plus_plus_baseline": {"needs_group": True},
    "remax": {"needs_greedy_baseline": True},
    "opo": {"needs_group": True},
    "gpg": {"needs_group": True},
    "grpo_passk": {"needs_group": True},
    "gdpo": {"needs_group": True, "needs_reward_components": True},
    "optimal_token_baseline": {
        "needs_group": True,
        "needs_old_log_probs": True,
        "needs_sum_pi_squared": True,
    },
    "tir_optimal_token_baseline": {
        "needs_group": True,
        "needs_old_log_probs": True,
        "needs_sum_pi_squared": True,
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CAPS))
def test_registered_with_capabilities_and_docs(name):
    comp = rlzoo.get_plugin_manager().registry("advantage").get(name)
    assert comp.load() is getattr(F, name)
    assert dict(comp.capabilities) == EXPECTED_CAPS[name]
    assert comp.summary and comp.plugin == "rlzoo.algorithms.advantage"
    for f in comp.param_fields():
        assert f["help"], f"{name}.{f['name']} has no help"
    with pytest.raises(dataclasses.FrozenInstanceError):
        comp.default_params().__setattr__("x", 1)


def test_aliases_and_light_module():
    reg = rlzoo.get_plugin_manager().registry("advantage")
    assert reg.get("reinforce++").name == "reinforce_plus_plus"
    assert reg.get("grpo_vectorized").name == "grpo"  # verl's vectorized estimators: same formulas
    assert reg.get("rloo_vectorized").name == "rloo"
    assert "torch" not in vars(adv_mod)  # the registration module does not import torch


# --------------------------------------------------------------------------- gdpo
def _grpo_adv(xs, groups, eps=1e-6):
    out = []
    for i, x in enumerate(xs):
        g = [xs[j] for j in range(len(xs)) if groups[j] == groups[i]]
        m = sum(g) / len(g)
        sd = math.sqrt(sum((v - m) ** 2 for v in g) / (len(g) - 1))
        out.append((x - m) / (sd + eps))
    return out


def _whiten(xs):
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - m) / math.sqrt(var + 1e-8) for x in xs]


def test_gdpo_normalises_each_component_then_whitens():
    # two groups of two, one-token responses; components r1 = 1, 0 | 1, 3 and r2 = 0, 2 | 0, 0
    groups = [0, 0, 1, 1]
    r1, r2 = [1.0, 0.0, 1.0, 3.0], [0.0, 2.0, 0.0, 0.0]
    comps = torch.tensor([r1, r2], dtype=torch.float64).t()  # [B, K]
    mask = torch.ones(4, 1, dtype=torch.float64)
    inputs = AdvantageInputs(
        torch.zeros(4, 1, dtype=torch.float64), mask, torch.tensor(groups), reward_components=comps
    )
    out = call("gdpo", inputs, reward_keys=["acc", "format"], reward_weights=[1.0, 0.5])
    a1, a2 = _grpo_adv(r1, groups), _grpo_adv(r2, groups)  # group 1 of r2 is all-equal: 0
    want = _whiten([x + 0.5 * y for x, y in zip(a1, a2)])
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor(want, dtype=torch.float64))
    # summing the rewards first (GRPO) gives different advantages: the point of decoupling
    summed = _whiten(_grpo_adv([x + 0.5 * y for x, y in zip(r1, r2)], groups))
    assert not torch.allclose(out.advantages[:, 0], torch.tensor(summed, dtype=torch.float64))


def test_gdpo_without_components_is_whitened_grpo_and_keys_need_components():
    inp = make_inputs()
    out = call("gdpo", inp)
    grpo = call("grpo", inp).advantages
    torch.testing.assert_close(out.advantages, F.masked_whiten(grpo, inp.response_mask) * inp.response_mask)
    with pytest.raises(ValueError, match="reward_components"):
        call("gdpo", inp, reward_keys=["acc", "format"])
    with pytest.raises(ValueError, match="reward_weights"):
        call("gdpo", make_inputs(reward_components=torch.ones(6, 2)), reward_weights=[1.0])


# --------------------------------------------------------------------------- optimal token baseline
def _otb_inputs(mask_rows, reward_rows, ids=(0, 0)):
    mask = torch.tensor(mask_rows, dtype=torch.float64)
    # pi = .5 and sum pi^2 = .5 everywhere: w_t = 1 - 2 * .5 + .5 = .5
    half = torch.full_like(mask, 0.5)
    return AdvantageInputs(
        torch.tensor(reward_rows, dtype=torch.float64),
        mask,
        torch.tensor(ids),
        old_log_probs=half.log(),
        sum_pi_squared=half,
    )


def test_optimal_token_baseline_hand_worked():
    # response 0: length 3, reward 1; response 1: length 2, reward 0. W: .5, 1, 1.5 and .5, 1
    # B_0 = (1 * .5 + 0 * .5) / 1 = .5; B_1 = (1 * 1 + 0) / 2 = .5; B_2 = 1.5 / 1.5 = 1
    inp = _otb_inputs([[1, 1, 1], [1, 1, 0]], [[0, 0, 1.0], [0, 0, 0]])
    out = call("optimal_token_baseline", inp, handle_zero_tail=False)
    torch.testing.assert_close(
        out.advantages, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1, 1], [0, 0, 0]], dtype=torch.float64))
    # zero tail: response 0 is the single longest, so past length 2 its baseline is 0
    out = call("optimal_token_baseline", inp)
    torch.testing.assert_close(
        out.advantages, torch.tensor([[0.5, 0.5, 1.0], [-0.5, -0.5, 0.0]], dtype=torch.float64)
    )
    # a group of one: no baseline, the advantage is the return
    alone = _otb_inputs([[1, 1, 1], [1, 1, 0]], [[0, 0, 1.0], [0, 0, 0]], ids=(0, 1))
    torch.testing.assert_close(
        call("optimal_token_baseline", alone).advantages,
        alone.token_level_rewards.flip(-1).cumsum(-1).flip(-1) * alone.response_mask,
    )
    with pytest.raises(ValueError, match="sum_pi_squared"):
        call("optimal_token_baseline", make_inputs())


def test_tir_optimal_token_baseline_counts_valid_tokens_only():
    # response 0 has an observation span at t=1: its valid tokens are t = 0, 2, 3
    inp = _otb_inputs([[1, 0, 1, 1], [1, 1, 0, 0]], [[0, 0, 0, 1.0], [0, 0, 0, 0]])
    tir = call("tir_optimal_token_baseline", inp)
    # packed, this is the previous example: .5, .5, 1 and -.5, -.5
    want = torch.tensor([[0.5, 0.0, 0.5, 1.0], [-0.5, -0.5, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(tir.advantages, want)
    # by padded position, t=2 of response 0 meets t=2 of response 1 (masked): another baseline
    flat = call("optimal_token_baseline", inp)
    assert not torch.allclose(flat.advantages, want)
