"""Advantage estimators against verl 0.9.1's own functions on randomised float64 batches.

Compared on every valid token (rlzoo zeroes masked positions on purpose; verl leaves some of
them arbitrary): advantages and returns. Groups of 1, 4 and 16, an all-equal group, ragged
lengths, masked spans inside responses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlzoo
from rlzoo.kernel.protocols import AdvantageInputs

from ._verl import DT, RECORD, core_algos, make_batch

SEEDS = (0, 1, 2)
CFG_GAMMA = {"gamma": 1.0}


class _Cfg(dict):
    """verl's AlgoConfig stand-in: attribute and .get access."""

    __getattr__ = dict.get


def ours(name, inputs, **kw):
    comp = rlzoo.get_plugin_manager().registry("advantage").get(name)
    return comp.load()(inputs, comp.params(**kw))


def compare(part, batch, out, verl_adv, verl_ret=None):
    valid = batch.mask.bool()
    RECORD.close(part, "advantages", out.advantages[valid], verl_adv[valid])
    assert (out.advantages[~valid] == 0).all()
    if verl_ret is not None:
        RECORD.close(part, "returns", out.returns[valid], verl_ret[valid])


def base_inputs(b, **kw):
    return AdvantageInputs(b.rewards, b.mask, group_ids=b.group_ids, **kw)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_and_vectorized_alias(seed, norm):
    b = make_batch(seed)
    out = ours("grpo", base_inputs(b), norm_by_std=norm)
    adv, ret = core_algos.compute_grpo_outcome_advantage(b.rewards, b.mask, b.index, 1e-6, norm)
    compare("grpo", b, out, adv, ret)
    # verl's grpo_vectorized computes in float32: same formula, float32 rounding
    gid = b.group_ids.numpy()
    vadv, _ = core_algos.compute_grpo_vectorized_outcome_advantage(b.rewards, b.mask, gid, 1e-6, norm)
    alias = ours("grpo_vectorized", base_inputs(b), norm_by_std=norm)
    RECORD.close("grpo_vectorized", "advantages", alias.advantages, vadv, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_and_vectorized_alias(seed):
    b = make_batch(seed)
    out = ours("rloo", base_inputs(b))
    adv, ret = core_algos.compute_rloo_outcome_advantage(b.rewards, b.mask, b.index)
    compare("rloo", b, out, adv, ret)
    alias = ours("rloo_vectorized", base_inputs(b))
    vadv, _ = core_algos.compute_rloo_vectorized_outcome_advantage(b.rewards, b.mask, b.index)
    counts = torch.bincount(b.group_ids)[b.group_ids]  # [B]
    multi = (counts > 1).unsqueeze(-1) & b.mask.bool()
    RECORD.close("rloo_vectorized", "advantages (groups > 1)", alias.advantages[multi], vadv[multi])
    # documented difference: verl's rloo_vectorized gives a group of one 0, verl's rloo (and
    # rlzoo) keep its reward
    single = (counts == 1).unsqueeze(-1) & b.mask.bool()
    assert single.any() and (vadv[single] == 0).all()
    torch.testing.assert_close(alias.advantages[single], adv[single])
    assert not torch.allclose(alias.advantages[single], vadv[single])


@pytest.mark.parametrize("seed", SEEDS)
def test_group_estimators(seed):
    b = make_batch(seed)
    cases = {
        "opo": core_algos.compute_opo_outcome_advantage(b.rewards, b.mask, b.index),
        "gpg": core_algos.compute_gpg_outcome_advantage(b.rewards.clone(), b.mask, b.index),
        "reinforce_plus_plus_baseline": core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
            b.rewards, b.mask, b.index
        ),
    }
    for name, (adv, ret) in cases.items():
        compare(name, b, ours(name, base_inputs(b)), adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk(seed, norm):
    b = make_batch(seed, group_sizes=(2, 4, 4, 16))  # pass@k needs two or more per group
    adv, ret = core_algos.compute_grpo_passk_outcome_advantage(
        b.rewards, b.mask, b.index, 1e-6, norm, config=_Cfg(norm_adv_by_std_in_grpo=norm)
    )
    compare("grpo_passk", b, ours("grpo_passk", base_inputs(b), norm_by_std=norm), adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(seed, gamma):
    b = make_batch(seed)
    b.rewards = b.rewards + torch.randn_like(b.rewards) * b.mask * 0.1  # dense rewards too
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(b.rewards, b.mask, _Cfg(gamma=gamma))
    compare(
        "reinforce_plus_plus",
        b,
        ours("reinforce_plus_plus", AdvantageInputs(b.rewards, b.mask), gamma=gamma),
        adv,
        ret,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_remax(seed):
    b = make_batch(seed)
    base = torch.randn(b.rewards.shape[0], dtype=DT)
    adv, ret = core_algos.compute_remax_outcome_advantage(b.rewards, base, b.mask)
    out = ours("remax", AdvantageInputs(b.rewards, b.mask, baseline_rewards=base))
    compare("remax", b, out, adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_gae(seed, gamma, lam):
    b = make_batch(seed)
    adv, ret = core_algos.compute_gae_advantage_return(b.rewards, b.values, b.mask, gamma, lam)
    out = ours("gae", AdvantageInputs(b.rewards, b.mask, values=b.values), gamma=gamma, lam=lam)
    compare("gae", b, out, adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_gdpo_single_reward(seed, norm):
    b = make_batch(seed)
    adv, ret = core_algos.compute_gdpo_outcome_advantage(b.rewards, b.mask, b.index, 1e-6, norm)
    compare("gdpo (one reward)", b, ours("gdpo", base_inputs(b), norm_by_std=norm), adv, ret)


@pytest.mark.parametrize("seed", SEEDS)
def test_gdpo_reward_components(seed):
    b = make_batch(seed, spans=False)
    B = b.mask.shape[0]
    g = torch.Generator().manual_seed(seed + 100)
    # float32-representable components (verl casts them to float32)
    comps = (torch.randint(0, 3, (B, 2), generator=g).to(DT) / 2).to(DT)
    keys, weights = ["format_reward", "accuracy_reward"], [0.25, 1.0]
    P = 3
    attention = torch.cat([torch.ones(B, P, dtype=torch.long), b.mask.long()], dim=1)
    adv, _ = core_algos.compute_gdpo_outcome_advantage(
        b.rewards,
        b.mask,
        b.index,
        1e-6,
        True,
        config=_Cfg(gdpo_reward_keys=keys, gdpo_reward_weights=weights),
        non_tensor_batch={k: comps[:, i].numpy() for i, k in enumerate(keys)},
        batch={"prompts": torch.zeros(B, P), "attention_mask": attention},
    )
    out = ours("gdpo", base_inputs(b, reward_components=comps), reward_keys=keys, reward_weights=weights)
    valid = b.mask.bool()
    RECORD.close(
        "gdpo (two components)", "advantages", out.advantages[valid], adv[valid].to(DT), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("tir", [False, True])
def test_optimal_token_baselines(seed, with_is, zero_tail, tir):
    b = make_batch(seed)
    b.rewards = b.rewards + torch.randn_like(b.rewards) * b.mask * 0.1
    w = b.is_weights if with_is else None
    fn = (
        core_algos.compute_multi_turn_optimal_token_baseline_advantage
        if tir
        else core_algos.compute_optimal_token_baseline_advantage
    )
    adv, ret = fn(b.rewards, b.mask, b.index, b.old_log_probs, b.sum_pi_squared, w, zero_tail, 1e-8)
    name = "tir_optimal_token_baseline" if tir else "optimal_token_baseline"
    inputs = base_inputs(
        b, old_log_probs=b.old_log_probs, sum_pi_squared=b.sum_pi_squared, rollout_is_weights=w
    )
    compare(name, b, ours(name, inputs, handle_zero_tail=zero_tail), adv, ret)


def test_optimal_token_baseline_with_an_empty_response():
    b = make_batch(5, spans=False)
    b.mask[3] = 0.0
    b.rewards[3] = 0.0
    for tir, name in [(False, "optimal_token_baseline"), (True, "tir_optimal_token_baseline")]:
        fn = (
            core_algos.compute_multi_turn_optimal_token_baseline_advantage
            if tir
            else core_algos.compute_optimal_token_baseline_advantage
        )
        adv, ret = fn(b.rewards, b.mask, b.index, b.old_log_probs, b.sum_pi_squared, None, True, 1e-8)
        inputs = base_inputs(b, old_log_probs=b.old_log_probs, sum_pi_squared=b.sum_pi_squared)
        compare(name, b, ours(name, inputs), adv, ret)


def test_group_ids_as_verl_uids():
    # verl groups by arbitrary uid objects; rlzoo by integer ids: the grouping is the same
    b = make_batch(7)
    assert len(np.unique(b.index)) == len(torch.unique(b.group_ids))


def test_documented_differences_where_verl_is_undefined():
    """docs/components/advantage.md, differences 1-3: asserted as differences."""
    # 1. masked positions: verl leaves GAE returns (A + V) on padding, rlzoo zeroes them
    b = make_batch(0)
    _, ret = core_algos.compute_gae_advantage_return(b.rewards, b.values, b.mask, 1.0, 1.0)
    out = ours("gae", AdvantageInputs(b.rewards, b.mask, values=b.values))
    pad = ~b.mask.bool()
    assert (ret[pad] != 0).any() and (out.returns[pad] == 0).all()
    # 2. whitening one valid token: verl raises, rlzoo gives 0
    one = torch.zeros(2, 3, dtype=DT)
    one[0, 0] = 1.0
    with pytest.raises(ValueError):
        core_algos.compute_reinforce_plus_plus_outcome_advantage(one, one, _Cfg(gamma=1.0))
    assert (ours("reinforce_plus_plus", AdvantageInputs(one, one)).advantages == 0).all()
    # 3. OPO on a group whose responses are all empty: verl NaN, rlzoo 0
    rewards, mask = torch.zeros(2, 3, dtype=DT), torch.zeros(2, 3, dtype=DT)
    adv, _ = core_algos.compute_opo_outcome_advantage(rewards, mask, np.array(["a", "a"], dtype=object))
    got = ours("opo", AdvantageInputs(rewards, mask, group_ids=torch.tensor([0, 0])))
    assert torch.isnan(adv).all()
    assert torch.isfinite(got.advantages).all() and (got.advantages == 0).all()
