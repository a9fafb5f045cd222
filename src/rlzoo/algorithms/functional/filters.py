"""Sample filters: the tensor code behind :mod:`rlzoo.algorithms.filters`.

``fn(rewards [N], group_ids [N], params) -> keep [N] (bool)``; decisions are per group, computed
with segment reductions (no Python loop over groups).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..filters import DynamicSamplingParams, NoFilterParams

__all__ = ["dynamic_sampling", "none"]


def none(rewards: Tensor, group_ids: Tensor, params: NoFilterParams) -> Tensor:
    """Keep everything."""
    return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)  # [N]


@torch.no_grad()
def dynamic_sampling(rewards: Tensor, group_ids: Tensor, params: DynamicSamplingParams) -> Tensor:
    """DAPO dynamic sampling: keep the groups whose metric varies (std > 0), and groups of one.

    ``std > 0`` is tested exactly as ``max > min`` within the group (no rounding).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [N]
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    values = rewards.to(torch.float64)  # [N]
    hi = torch.full((num_groups,), -torch.inf, dtype=values.dtype, device=values.device)
    lo = torch.full((num_groups,), torch.inf, dtype=values.dtype, device=values.device)
    hi = hi.scatter_reduce(0, inverse, values, "amax")  # [G]
    lo = lo.scatter_reduce(0, inverse, values, "amin")  # [G]
    count = torch.bincount(inverse, minlength=num_groups)  # [G]
    keep_group = hi > lo  # [G]
    if params.keep_singletons:
        keep_group = keep_group | (count == 1)  # [G]
    return keep_group[inverse]  # [N]
