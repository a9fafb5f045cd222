"""Loss aggregations: hand-worked values and invariance to how a mini-batch is split."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlzoo
from rlzoo.algorithms.functional import loss_agg as F
from rlzoo.algorithms.loss_agg import SeqMeanTokenSumNormParams
from rlzoo.train_kit.formulas import make_agg_context

NAMES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
FNS = {
    "token-mean": F.token_mean,
    "token-sum": F.token_sum,
    "seq-mean-token-sum": F.seq_mean_token_sum,
    "seq-mean-token-mean": F.seq_mean_token_mean,
    "seq-mean-token-sum-norm": F.seq_mean_token_sum_norm,
}

# B=3, T=3; row 2 fully masked.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


def agg_full(name, loss=LOSS, mask=MASK, params=None, **ctx_kw):
    ctx = make_agg_context(mask, **ctx_kw)
    return F.bind_agg(FNS[name], ctx, params)(loss, mask)


def test_context_counts():
    ctx = make_agg_context(MASK)
    # tokens: 3 + 1 + 0 = 4; non-empty sequences: rows 0 and 1 = 2; T = 3
    assert ctx.global_tokens == 4.0
    assert ctx.global_sequences == 2.0
    assert ctx.max_response_length == 3
    assert make_agg_context(MASK, max_response_length=16).max_response_length == 16


def test_hand_values():
    # token-mean: (1+2+3+4) / 4 = 2.5
    assert agg_full("token-mean").item() == pytest.approx(2.5)
    # token-sum: 1+2+3+4 = 10
    assert agg_full("token-sum").item() == pytest.approx(10.0)
    # token-sum with loss_scale_factor 4: 10 / 4
    assert agg_full("token-sum", loss_scale_factor=4.0).item() == pytest.approx(2.5)
    # seq-mean-token-sum: (6 + 4) / 2 = 5
    assert agg_full("seq-mean-token-sum").item() == pytest.approx(5.0)
    # seq-mean-token-mean: (6/3 + 4/1) / 2 = (2 + 4) / 2 = 3
    assert agg_full("seq-mean-token-mean").item() == pytest.approx(3.0)
    # seq-mean-token-sum-norm (L = T = 3): (6 + 4) / 2 / 3 = 5/3
    assert agg_full("seq-mean-token-sum-norm").item() == pytest.approx(5.0 / 3.0)
    # ... with max_response_length=10: 5 / 10
    assert agg_full("seq-mean-token-sum-norm", max_response_length=10).item() == pytest.approx(0.5)
    # ... with params.loss_scale_factor=5 (takes precedence): 5 / 5
    p = SeqMeanTokenSumNormParams(loss_scale_factor=5.0)
    assert agg_full("seq-mean-token-sum-norm", params=p, max_response_length=10).item() == pytest.approx(1.0)


@pytest.mark.parametrize("name", NAMES)
def test_masked_values_do_not_matter(name):
    garbage = LOSS.clone()
    garbage[MASK == 0] = float("nan")
    garbage[2, 0] = float("inf")
    assert agg_full(name, garbage).item() == pytest.approx(agg_full(name).item())


@pytest.mark.parametrize("name", NAMES)
def test_all_masked_is_zero(name):
    mask = torch.zeros(2, 3, dtype=torch.long)
    out = agg_full(name, LOSS[:2], mask)
    assert out.item() == 0.0 and math.isfinite(out.item())


@pytest.mark.parametrize("name", NAMES)
def test_gradient_only_on_valid_tokens(name):
    loss = LOSS.clone().requires_grad_(True)
    agg_full(name, loss).backward()
    assert torch.all(loss.grad[MASK == 0] == 0)
    assert torch.all(loss.grad[MASK == 1] > 0)


def _split_sum(name, loss, mask, bounds, params=None):
    """Sum of the aggregation over micro-batches loss[a:b] with the full batch's context."""
    ctx = make_agg_context(mask)
    agg = F.bind_agg(FNS[name], ctx, params)
    return sum(agg(loss[a:b], mask[a:b]) for a, b in itertools.pairwise(bounds))


@st.composite
def batches(draw):
    b = draw(st.integers(1, 8))
    t = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))  # 0: fully masked row
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, T]
    seed = draw(st.integers(0, 2**16))
    loss = torch.randn(b, t, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    cuts = draw(st.lists(st.integers(1, max(b - 1, 1)), max_size=4)) if b > 1 else []
    bounds = sorted({0, b, *cuts})
    return loss, mask, bounds


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_split_invariance_hypothesis(name, batch):
    loss, mask, bounds = batch
    full = agg_full(name, loss, mask)
    assert _split_sum(name, loss, mask, bounds).item() == pytest.approx(full.item(), abs=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_split_8x1_1x8_2x4_uneven(name):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 1, 0, 3, 5, 2, 0, 4])  # two fully masked rows, a length-1 row
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
    full = agg_full(name, loss, mask).item()
    for bounds in ([0, 8], list(range(9)), [0, 4, 8], [0, 1, 6, 8], [0, 3, 8]):
        assert _split_sum(name, loss, mask, bounds).item() == pytest.approx(full, abs=1e-12), bounds


def test_split_invariance_of_gradients():
    """Accumulating gradients over micro-batches gives the full-batch gradient."""
    g = torch.Generator().manual_seed(1)
    loss_full = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = (torch.arange(4)[None, :] < torch.tensor([4, 2, 0, 1, 3, 4])[:, None]).long()
    ctx = make_agg_context(mask)
    for fn in FNS.values():
        agg = F.bind_agg(fn, ctx, None)
        (g_full,) = torch.autograd.grad(agg(loss_full, mask), loss_full)
        acc = sum(agg(loss_full[a:b], mask[a:b]) for a, b in [(0, 1), (1, 4), (4, 6)])
        (g_acc,) = torch.autograd.grad(acc, loss_full)
        torch.testing.assert_close(g_acc, g_full)


def test_registered_and_loadable():
    reg = rlzoo.get_plugin_manager().registry("loss_agg")
    assert set(NAMES) <= set(reg.names())
    for name in NAMES:
        comp = reg.get(name)
        assert comp.summary
        fn = comp.load()
        ctx = make_agg_context(MASK)
        assert fn(LOSS, MASK, ctx, comp.default_params()).item() == pytest.approx(agg_full(name).item())
