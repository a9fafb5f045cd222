"""The tensor code of ``example_rloo`` (imported only when the part is used).

Shapes: ``B`` responses, ``T`` response tokens, ``G`` distinct group ids.
"""

from __future__ import annotations

import torch

from rlzoo.kernel.protocols import AdvantageInputs, AdvantageOutput

from .plugin import ExampleRLOOParams


def example_rloo(inputs: AdvantageInputs, params: ExampleRLOOParams) -> AdvantageOutput:
    """A_i = r_i - w * (sum_group - r_i) / (n - 1); a group of one keeps A_i = r_i."""
    if inputs.group_ids is None:
        raise ValueError("advantage 'example_rloo' needs group_ids (capability needs_group), got None")
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)  # [B, T]
    # Masked positions may hold anything: select, don't multiply (0 * inf is nan).
    rewards = torch.where(mask.bool(), inputs.token_level_rewards, torch.zeros_like(mask))  # [B, T]
    scores = rewards.sum(dim=-1)  # [B]
    _, inverse = torch.unique(inputs.group_ids, return_inverse=True)  # [B] in 0..G-1
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    group_sum = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, inverse, scores
    )  # [G]
    count = torch.bincount(inverse, minlength=num_groups).to(scores.dtype)  # [G]
    others = (count[inverse] - 1).clamp(min=1)  # [B] n - 1 (1 for a group of one: no baseline)
    baseline = torch.where(
        count[inverse] > 1, (group_sum[inverse] - scores) / others, torch.zeros_like(scores)
    )  # [B]
    adv = scores - params.baseline_weight * baseline  # [B]
    if params.clip is not None:
        adv = adv.clamp(-params.clip, params.clip)  # [B]
    advantages = adv.unsqueeze(-1) * mask  # [B, T]
    return AdvantageOutput(advantages=advantages, returns=advantages.clone())
