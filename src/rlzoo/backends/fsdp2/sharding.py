"""Pure helpers of the fsdp2 backend: data-parallel sharding plans (packing: :mod:`rlzoo.train_kit.logprobs`).

Nothing here talks to other ranks. Every rank receives the same full mini-batch and computes the
same plan from it, so the plan itself needs no communication: rank ``r`` trains on
``plan.shards[r]`` and every rank runs ``plan.num_micro_batches`` forward/backward passes (FSDP2's
all-gathers and reduce-scatters are collectives: a rank with fewer real micro-batches runs dummy
ones, see :class:`ShardPlan`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlzoo.kernel.batch import Batch

__all__ = ["ShardPlan", "balanced_shards", "micro_batch_bounds", "plan_shards"]


def balanced_shards(tokens: Sequence[int], world: int) -> list[list[int]]:
    """Split sample indices over ``world`` ranks, balancing the sum of ``tokens`` per rank.

    Greedy longest-processing-time: samples in decreasing token count (ties: lower index first)
    go to the rank with the fewest tokens so far (ties: fewer samples, then lower rank). Each
    rank's indices are returned in increasing order (the original batch order). Deterministic.
    """
    heap = [(0, 0, r) for r in range(world)]  # (tokens, samples, rank)
    shards: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(tokens)), key=lambda i: (-int(tokens[i]), i)):  # scheduling over B ints
        load, count, r = heapq.heappop(heap)
        shards[r].append(i)
        heapq.heappush(heap, (load + int(tokens[i]), count + 1, r))
    return [sorted(s) for s in shards]


def micro_batch_bounds(tokens: Sequence[int], *, rows: int, max_tokens: int | None) -> list[tuple[int, int]]:
    """``[start, end)`` bounds of consecutive micro-batches of one rank's shard.

    ``max_tokens`` set: at most that many real tokens each (a longer sample goes alone), as the
    native backend packs; otherwise ``rows`` samples each. An empty shard has no micro-batches.
    """
    n = len(tokens)
    if max_tokens is None:
        return [(i, min(i + rows, n)) for i in range(0, n, rows)]
    out, start, used = [], 0, 0
    for i, t in enumerate(tokens):
        if i > start and used + t > max_tokens:
            out.append((start, i))
            start, used = i, 0
        used += int(t)
    if n:
        out.append((start, n))
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Which samples each rank takes and how it cuts them into micro-batches.

    ``shards[r]``: original indices of rank ``r``'s samples (increasing). ``bounds[r]``: its
    micro-batches as ``[start, end)`` into ``shards[r]``. ``num_micro_batches``: the maximum over
    ranks; a rank with fewer runs ``num_micro_batches - len(bounds[r])`` dummy passes whose loss is
    multiplied by zero, so every rank issues the same collectives.
    """

    shards: list[list[int]]
    bounds: list[list[tuple[int, int]]]

    @property
    def num_micro_batches(self) -> int:
        return max((len(b) for b in self.bounds), default=0)

    @property
    def max_shard(self) -> int:
        return max((len(s) for s in self.shards), default=0)

    def order(self) -> Tensor:
        """The original index of each row of ``cat(shards)`` (to undo the sharding)."""
        return torch.tensor([i for s in self.shards for i in s], dtype=torch.long)


def plan_shards(batch: Batch, world: int, *, rows: int, max_tokens: int | None) -> ShardPlan:
    """The plan for ``batch`` (real tokens = ``attention_mask`` sums, prompt + response)."""
    tokens = batch["attention_mask"].sum(-1).tolist()  # [B]
    shards = balanced_shards(tokens, world)
    bounds = [micro_batch_bounds([tokens[i] for i in s], rows=rows, max_tokens=max_tokens) for s in shards]
    return ShardPlan(shards, bounds)
