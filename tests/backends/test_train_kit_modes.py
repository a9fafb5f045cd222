"""rlzoo.train_kit.modes.eval_mode: eval inside the block, the previous mode back after it."""

from __future__ import annotations

import pytest
from torch import nn

from rlzoo.train_kit.modes import eval_mode


@pytest.mark.parametrize("training", [True, False])
def test_eval_inside_and_the_previous_mode_back_after(training: bool) -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train(training)
    with eval_mode(m) as inside:
        assert inside is m and not m.training and not m[1].training
    assert m.training is training and m[1].training is training


def test_the_mode_comes_back_when_the_block_raises() -> None:
    m = nn.Dropout(0.5).train(True)
    with pytest.raises(RuntimeError, match="boom"), eval_mode(m):
        raise RuntimeError("boom")
    assert m.training
