"""Clipped value loss: hand-worked values, zero gradient where clipped, split invariance."""

from __future__ import annotations

import pytest
import torch

from rlzoo.algorithms.functional import loss_agg as A
from rlzoo.train_kit.formulas import make_agg_context, value_loss

D = torch.float64


def _agg(mask, fn=A.token_mean):
    return A.bind_agg(fn, make_agg_context(mask), None)


def test_hand_values_and_gradient():
    # eps_v = 0.5
    # t0: v = 1, v_old = 0, R = 2: v_clip = 0.5; (v-R)^2 = 1, (v_clip-R)^2 = 2.25 -> 2.25 (clipped)
    # t1: v = 1, v_old = 0.8, R = 0: v_clip = 1 (inside [0.3, 1.3]); 1 vs 1 -> 1 (not clipped)
    # t2: v = -1, v_old = 0, R = 0: v_clip = -0.5; 1 vs 0.25 -> 1 (not clipped)
    # t3: masked (v = 100)
    values = torch.tensor([[1.0, 1.0], [-1.0, 100.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.0, 0.8], [0.0, 0.0]], dtype=D)
    ret = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = value_loss(values, old, ret, mask, _agg(mask), cliprange_value=0.5)
    # 0.5 * (2.25 + 1 + 1) / 3 tokens
    assert loss.item() == pytest.approx(0.5 * 4.25 / 3)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["vpred_mean"].item() == pytest.approx(1 / 3)
    (g,) = torch.autograd.grad(loss, values)
    # clipped t0: the max picks the clipped term, constant in v -> 0;
    # t1: 0.5 * 2 (v - R) / 3 = 1/3; t2: 0.5 * 2 * (-1) / 3 = -1/3; masked: 0
    torch.testing.assert_close(g, torch.tensor([[0.0, 1 / 3], [-1 / 3, 0.0]], dtype=D))


def test_no_clip_is_half_mse():
    values = torch.tensor([[0.0, 3.0]], dtype=D)
    old = torch.tensor([[10.0, -10.0]], dtype=D)
    ret = torch.tensor([[1.0, 1.0]], dtype=D)
    mask = torch.ones(1, 2)
    loss, metrics = value_loss(values, old, ret, mask, _agg(mask), cliprange_value=float("inf"))
    # 0.5 * (1 + 4) / 2
    assert loss.item() == pytest.approx(1.25)
    assert metrics["vf_clipfrac"].item() == 0.0


@pytest.mark.parametrize("fn", [A.token_mean, A.seq_mean_token_mean])
def test_split_invariance(fn):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(6, 4, generator=g, dtype=D, requires_grad=True)
    old = values.detach() + 0.3 * torch.randn(6, 4, generator=g, dtype=D)
    ret = torch.randn(6, 4, generator=g, dtype=D)
    mask = (torch.arange(4)[None, :] < torch.tensor([4, 1, 0, 2, 4, 3])[:, None]).long()
    agg = _agg(mask, fn)
    full, _ = value_loss(values, old, ret, mask, agg, 0.2)
    parts = [
        value_loss(values[a:b], old[a:b], ret[a:b], mask[a:b], agg, 0.2)[0]
        for a, b in [(0, 2), (2, 3), (3, 6)]
    ]
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-12)


def test_masked_positions_do_not_matter():
    values = torch.tensor([[1.0, 2.0]], dtype=D)
    old = torch.tensor([[0.5, 0.0]], dtype=D)
    ret = torch.tensor([[0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 0]])
    a, ma = value_loss(values, old, ret, mask, _agg(mask), 0.2)
    values[0, 1], old[0, 1], ret[0, 1] = 1e6, -1e6, 3.0
    b, mb = value_loss(values, old, ret, mask, _agg(mask), 0.2)
    assert a.item() == b.item()
    assert ma["vf_clipfrac"].item() == mb["vf_clipfrac"].item()
