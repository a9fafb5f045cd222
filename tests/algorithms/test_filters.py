"""Sample filters: DAPO dynamic sampling keeps groups whose reward varies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo


def call(name, rewards, ids, **kw):
    comp = rlzoo.get_plugin_manager().registry("sample_filter").get(name)
    return comp.load()(rewards, ids, comp.params(**kw))


def test_dynamic_sampling_hand_example():
    # group 9: 1, 1, 1 (std 0: dropped); group 4: 0, 1, 0 (kept); group 100: a single response (kept)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 5.0])
    ids = torch.tensor([9, 4, 9, 4, 9, 4, 100])
    keep = call("dynamic_sampling", rewards, ids)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False, True, False, True, True]
    keep = call("dynamic_sampling", rewards, ids, keep_singletons=False)
    assert keep.tolist() == [False, True, False, True, False, True, False]


def test_tiny_difference_counts_as_variation():
    keep = call("dynamic_sampling", torch.tensor([1.0, 1.0 + 1e-7]), torch.tensor([3, 3]))
    assert keep.tolist() == [True, True]


def test_none_keeps_everything():
    assert call("none", torch.zeros(3), torch.tensor([1, 1, 1])).tolist() == [True] * 3


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 4), min_size=1, max_size=20), seed=st.integers(0, 999))
def test_matches_per_group_definition_and_permutes(ids, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (len(ids),), generator=g).float()
    ids_t = torch.tensor(ids)
    keep = call("dynamic_sampling", rewards, ids_t)
    for i, gid in enumerate(ids):
        vals = rewards[ids_t == gid]
        assert keep[i].item() == (len(vals) == 1 or bool(vals.std(unbiased=False) > 0))
    perm = torch.randperm(len(ids), generator=g)
    assert torch.equal(call("dynamic_sampling", rewards[perm], ids_t[perm]), keep[perm])


def test_registration():
    reg = rlzoo.get_plugin_manager().registry("sample_filter")
    comp = reg.get("dynamic_sampling")
    assert comp.capability("refills") is True and comp.capability("needs_group") is True
    p = comp.default_params()
    assert p.metric == "reward" and p.max_num_gen_batches == 0
    assert reg.get("dapo") is comp
    assert reg.get("none").capability("refills") is False


@pytest.mark.parametrize("name", ["none", "dynamic_sampling"])
def test_documented(name):
    comp = rlzoo.get_plugin_manager().registry("sample_filter").get(name)
    assert comp.summary
    assert all(f["help"] for f in comp.param_fields())
