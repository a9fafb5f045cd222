"""Log-probs and entropy of tokens under logits sharded over the vocabulary (tensor parallel).

Each TP rank holds ``logits[..., vocab_start : vocab_start + V_local]``. The log-softmax over the
full vocabulary needs three reductions across ranks (a max, two sums), never the full logits::

    m     = max_r max_v z_r                  (detached: log-softmax is shift-invariant)
    S     = sum_r sum_v exp(z_r - m)
    z_t   = sum_r [t in shard r] (z_r[t - start_r] - m)
    log p(t) = z_t - log S
    H     = log S - sum_r sum_v softmax(z)_v (z_v - m)

The reductions are passed in, so one function serves both worlds:

- on GPUs, ``reduce_sum`` is ``torch.distributed.nn.functional.all_reduce`` over the TP group
  (differentiable: its backward is an all-reduce of the gradients) and ``reduce_max`` an in-place
  ``all_reduce(op=MAX)`` (see :func:`tp_reductions`);
- on CPU, :func:`simulate_vocab_parallel` stacks the shards along a leading rank dimension and
  reduces over it, which is exactly what the collectives compute on each rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["simulate_vocab_parallel", "tp_reductions", "vocab_parallel_log_probs"]

Reduce = Callable[[Tensor], Tensor]


def vocab_parallel_log_probs(
    local_logits: Tensor,
    targets: Tensor,
    vocab_start: int | Tensor,
    *,
    reduce_sum: Reduce,
    reduce_max: Reduce,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``log softmax(logits / temperature)`` at ``targets`` (+ entropy) from this rank's vocab shard.

    ``local_logits`` ``[..., V_local]``; ``targets`` ``[...]`` (global token ids); ``vocab_start``
    the global id of this shard's first column. ``vocab_size``: the real vocabulary; columns at or
    past it (megatron's padding rows) are masked out of the softmax. Computed in fp32.
    """
    z = local_logits.float()  # [..., Vl]
    if temperature != 1.0:
        z = z / temperature
    v_local = z.shape[-1]
    if vocab_size is not None:
        start = torch.as_tensor(vocab_start, device=z.device)
        cols = torch.arange(v_local, device=z.device) + start.unsqueeze(-1)  # [Vl] or [tp, 1.., Vl]
        z = z.masked_fill(cols >= vocab_size, float("-inf"))  # padding rows: probability 0
    m = reduce_max(z.detach().amax(-1))  # [...]
    shifted = z - m.unsqueeze(-1)  # [..., Vl]
    exp = shifted.exp()  # [..., Vl]
    sum_exp = reduce_sum(exp.sum(-1))  # [...]
    local_t = targets.long() - torch.as_tensor(vocab_start, device=z.device)  # [...]
    in_shard = (local_t >= 0) & (local_t < v_local)  # [...]
    picked = shifted.gather(-1, local_t.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)  # [...]
    picked = reduce_sum(torch.where(in_shard, picked, torch.zeros_like(picked)))  # [...]
    log_z = sum_exp.log()  # [...]
    log_probs = picked - log_z  # [...]
    entropy = None
    if with_entropy:
        probs = exp / sum_exp.unsqueeze(-1)  # [..., Vl]
        # 0·(-inf) → 0 for masked padding columns; -inf is replaced before the product, else its
        # backward (d/dprobs = shifted) makes the gradient NaN even where the forward is masked
        weighted = probs * torch.where(probs > 0, shifted, torch.zeros_like(shifted))  # [..., Vl]
        entropy = log_z - reduce_sum(weighted.sum(-1))  # [...]
    return log_probs, entropy


def simulate_vocab_parallel(
    full_logits: Tensor,
    targets: Tensor,
    tp: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`vocab_parallel_log_probs` over ``tp`` simulated ranks, in one process (CPU tests).

    The logits ``[..., V]`` are split into ``tp`` shards stacked on a new leading rank dim
    ``[tp, ..., V/tp]``; each reduction sums / maxes over that dim and broadcasts back, as the
    all-reduce does on every rank. Returns rank 0's result (all ranks agree).
    """
    V = full_logits.shape[-1]
    if V % tp:
        raise ValueError(f"vocab {V} is not divisible by tp={tp}")
    shards = torch.stack(full_logits.chunk(tp, -1))  # [tp, ..., V/tp]
    extra = full_logits.dim() - 1
    starts = (torch.arange(tp) * (V // tp)).reshape(tp, *([1] * extra))  # [tp, 1, ...]

    def reduce_sum(x: Tensor) -> Tensor:
        return x.sum(0, keepdim=True).expand_as(x)

    def reduce_max(x: Tensor) -> Tensor:
        return x.amax(0, keepdim=True).expand_as(x)

    lp, ent = vocab_parallel_log_probs(
        shards,
        targets.unsqueeze(0).expand(tp, *targets.shape),
        starts,
        reduce_sum=reduce_sum,
        reduce_max=reduce_max,
        temperature=temperature,
        with_entropy=with_entropy,
        vocab_size=vocab_size,
    )
    return lp[0], None if ent is None else ent[0]


def tp_reductions(group: Any) -> tuple[Reduce, Reduce]:
    """``(reduce_sum, reduce_max)`` over a torch.distributed TP group (used on GPUs)."""
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_reduce

    def reduce_sum(x: Tensor) -> Tensor:
        return all_reduce(x, op=dist.ReduceOp.SUM, group=group)  # differentiable

    def reduce_max(x: Tensor) -> Tensor:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
        return x

    return reduce_sum, reduce_max
