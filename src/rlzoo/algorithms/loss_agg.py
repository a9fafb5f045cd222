"""Built-in loss aggregations (kind ``loss_agg``): per-token loss + mask -> scalar.

Import-light: params and registration only; the tensor code is
:mod:`rlzoo.algorithms.functional.loss_agg`. Every aggregation divides by the global token /
sequence counts of the whole mini-batch (``AggContext``), so summing it over any split of the
mini-batch into micro-batches or ranks gives the full-batch value. See docs/components/loss_agg.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo import hookimpl, param

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import LossAggFn
    from rlzoo.kernel.registry import Registrar

_IMPL = "rlzoo.algorithms.functional.loss_agg"


@dataclass(frozen=True)
class TokenMeanParams:
    """Mean over every unmasked token of the mini-batch: sum(l * m) / N_tokens.

    Long responses weigh more than short ones (each token counts once). DAPO's "token-level
    policy gradient loss" (https://arxiv.org/abs/2503.14476); verl's ``token-mean``.
    """


@dataclass(frozen=True)
class TokenSumParams:
    """Sum over every unmasked token: sum(l * m) / ctx.loss_scale_factor (1: a plain sum)."""


@dataclass(frozen=True)
class SeqMeanTokenSumParams:
    """Sum over each sequence's tokens, mean over sequences: sum_b sum_t(l * m) / N_seq."""


@dataclass(frozen=True)
class SeqMeanTokenMeanParams:
    """Mean over each sequence's tokens, then mean over sequences (GRPO, GSPO, SAPO).

    sum_b [sum_t(l * m) / n_b] / N_seq, where n_b is the length of response b and N_seq the
    global number of non-empty responses. Fully masked rows contribute nothing.
    """


@dataclass(frozen=True)
class SeqMeanTokenSumNormParams:
    """Sum over each sequence's tokens divided by a constant L, mean over sequences (Dr. GRPO).

    sum_b sum_t(l * m) / L / N_seq with L = ``loss_scale_factor`` or, when unset, the maximum
    response length (https://arxiv.org/abs/2503.20783). verl's ``seq-mean-token-sum-norm``.
    """

    loss_scale_factor: float | None = param(
        None, help="constant L that token sums are divided by; None uses max_response_length"
    )


@hookimpl
def rlzoo_register_loss_aggs(registry: Registrar[LossAggFn]) -> None:
    registry.register("token-mean", f"{_IMPL}:token_mean", params=TokenMeanParams)
    registry.register("token-sum", f"{_IMPL}:token_sum", params=TokenSumParams)
    registry.register("seq-mean-token-sum", f"{_IMPL}:seq_mean_token_sum", params=SeqMeanTokenSumParams)
    registry.register("seq-mean-token-mean", f"{_IMPL}:seq_mean_token_mean", params=SeqMeanTokenMeanParams)
    registry.register(
        "seq-mean-token-sum-norm", f"{_IMPL}:seq_mean_token_sum_norm", params=SeqMeanTokenSumNormParams
    )
