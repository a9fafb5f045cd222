"""Hand-worked values of the example plugin's parts."""

from __future__ import annotations

import pytest
import torch
from rlzoo_example.advantage import example_rloo
from rlzoo_example.plugin import ExampleRLOOParams, KeywordParams
from rlzoo_example.scorer import keyword_score

from rlzoo.kernel.protocols import AdvantageInputs


def test_leave_one_out_by_hand() -> None:
    # group 0: rewards 1, 0, 2 (n = 3)   group 1: reward 5 alone
    #   A_0 = 1 - (0 + 2) / 2 = 0;  A_1 = 0 - (1 + 2) / 2 = -1.5;  A_2 = 2 - (1 + 0) / 2 = 1.5
    #   A_3 = 5 (a group of one has no baseline)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)  # [B, T]
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[1, 0], rewards[2, 2], rewards[3, 0] = 1.0, 0.0, 2.0, 5.0
    out = example_rloo(
        AdvantageInputs(rewards, mask, group_ids=torch.tensor([7, 7, 7, 9])), ExampleRLOOParams()
    )
    expected = torch.tensor([0.0, -1.5, 1.5, 5.0])[:, None] * mask  # [B, T]
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)


def test_baseline_weight_and_clip() -> None:
    # w = 0.5: A_0 = 1 - 0.5 * 1 = 0.5;  A_1 = 0 - 0.5 * 1.5 = -0.75;  A_2 = 2 - 0.5 * 0.5 = 1.75 -> clip 1
    mask = torch.ones(3, 1)
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    params = ExampleRLOOParams(baseline_weight=0.5, clip=1.0)
    out = example_rloo(AdvantageInputs(rewards, mask, group_ids=torch.zeros(3, dtype=torch.long)), params)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([0.5, -0.75, 1.0]))


def test_needs_group_ids() -> None:
    with pytest.raises(ValueError, match="needs group_ids"):
        example_rloo(AdvantageInputs(torch.zeros(2, 2), torch.ones(2, 2)), ExampleRLOOParams())


def test_clip_must_be_positive() -> None:
    with pytest.raises(ValueError, match="clip must be positive"):
        ExampleRLOOParams(clip=0.0)


@pytest.mark.parametrize(
    ("response", "params", "score"),
    [
        ("Hello RLZoo", KeywordParams(), 1.0),
        ("Hello RLZoo", KeywordParams(case_sensitive=True), 0.0),
        ("hello", KeywordParams(keyword=""), 0.0),  # an empty keyword matches nothing
    ],
)
def test_keyword(response: str, params: KeywordParams, score: float) -> None:
    assert keyword_score(response, None, "default", {}, params)["score"] == score
