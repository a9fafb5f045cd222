"""Loss aggregations: per-token loss ``[B, T]`` + mask ``[B, T]`` -> scalar.

Every aggregation here divides by *global* normalisers carried in :class:`AggContext` (the token
and sequence counts of the whole mini-batch, over all micro-batches and data-parallel ranks),
never by the counts of the micro-batch it is given. The numerator is a plain sum over the
micro-batch, so for any split of a mini-batch into micro-batches (and ranks)::

    sum(agg(loss[s], mask[s]) for s in splits) == agg(loss, mask)

which is what gradient accumulation and data-parallel gradient averaging need (the caller sums,
it never averages, the micro-batch losses; with DDP/FSDP that average over ``world_size`` ranks,
multiply by ``world_size`` or build ``ctx`` from per-rank counts, see :func:`make_agg_context`).

Values at masked positions never reach the result (they are replaced by zero with
``torch.where``, so even ``inf`` / ``nan`` padding is harmless in the forward pass).
"""

from __future__ import annotations

import torch
from torch import Tensor

# the core builds the context for every update: it lives in rlzoo.train_kit.formulas
from rlzoo.kernel.protocols import AggContext, BoundAgg, LossAggFn

from ..loss_agg import (
    SeqMeanTokenMeanParams,
    SeqMeanTokenSumNormParams,
    SeqMeanTokenSumParams,
    TokenMeanParams,
    TokenSumParams,
)

__all__ = [
    "bind_agg",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
    "token_sum",
]


def bind_agg(fn: LossAggFn, ctx: AggContext, params: object = None) -> BoundAgg:
    """Bind an aggregation to its context and params (its own params dataclass, or None for its
    defaults): ``agg(per_token_loss, mask) -> scalar``."""

    def agg(per_token_loss: Tensor, mask: Tensor) -> Tensor:
        return fn(per_token_loss, mask, ctx, params)

    agg.__name__ = f"bound_{getattr(fn, '__name__', 'agg')}"
    agg.__qualname__ = agg.__name__
    return agg


# -- helpers --------------------------------------------------------------------------------------
def _masked(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """The loss with masked positions set to exactly zero (whatever they held)."""
    return torch.where(mask.bool(), per_token_loss, torch.zeros_like(per_token_loss))  # [B, T]


def _positive(x: float) -> float:
    # a zero count only happens when the numerator is a sum of nothing (all masked): return 0
    return x if x > 0 else 1.0


# -- aggregations ---------------------------------------------------------------------------------
def token_mean(
    per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: TokenMeanParams | None = None
) -> Tensor:
    """sum_{b,t} m_bt l_bt / N_tokens (N_tokens global). DAPO's token-level loss."""
    return _masked(per_token_loss, mask).sum() / _positive(ctx.global_tokens)


def token_sum(
    per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: TokenSumParams | None = None
) -> Tensor:
    """sum_{b,t} m_bt l_bt / ctx.loss_scale_factor (a plain sum when the factor is 1)."""
    return _masked(per_token_loss, mask).sum() / ctx.loss_scale_factor


def seq_mean_token_sum(
    per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: SeqMeanTokenSumParams | None = None
) -> Tensor:
    """(1 / N_seq) sum_b sum_t m_bt l_bt, N_seq = global number of non-empty sequences."""
    seq_sum = _masked(per_token_loss, mask).sum(dim=-1)  # [B]
    return seq_sum.sum() / _positive(ctx.global_sequences)


def seq_mean_token_mean(
    per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: SeqMeanTokenMeanParams | None = None
) -> Tensor:
    """(1 / N_seq) sum_b (sum_t m_bt l_bt / n_b); fully masked rows (n_b = 0) contribute 0."""
    seq_sum = _masked(per_token_loss, mask).sum(dim=-1)  # [B]
    seq_len = mask.bool().sum(dim=-1).clamp(min=1).to(seq_sum.dtype)  # [B]
    return (seq_sum / seq_len).sum() / _positive(ctx.global_sequences)


def seq_mean_token_sum_norm(
    per_token_loss: Tensor, mask: Tensor, ctx: AggContext, params: SeqMeanTokenSumNormParams | None = None
) -> Tensor:
    """(1 / N_seq) sum_b (sum_t m_bt l_bt / L), L = params.loss_scale_factor or ctx.max_response_length.

    Dr. GRPO's constant normaliser (https://arxiv.org/abs/2503.20783): every token of every
    sequence weighs the same, independent of the response lengths in the batch.
    """
    scale = None if params is None else params.loss_scale_factor  # params None: the defaults
    if scale is None:
        scale = ctx.max_response_length
    seq_sum = _masked(per_token_loss, mask).sum(dim=-1)  # [B]
    return seq_sum.sum() / _positive(ctx.global_sequences) / float(scale)
