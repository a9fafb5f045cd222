"""tasks._stamp.held_out_split: the held-out rows are never trained on; a split that leaves
nothing to train on is refused with the settings that caused it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlzoo.kernel.errors import RlzooError
from rlzoo.tasks._stamp import held_out_split


def test_val_disjoint_from_train_and_deterministic() -> None:
    items = list(range(50))
    train, val = held_out_split(items, SimpleNamespace(train_size=200, val_size=10, seed=3), what="n=50")
    assert len(train) == 200 and len(val) == 10 and len(set(val)) == 10
    assert not set(train) & set(val)
    assert set(train) | set(val) <= set(items)
    assert items == list(range(50))  # the caller's list is not shuffled in place
    assert held_out_split(items, SimpleNamespace(train_size=200, val_size=10, seed=3), what="n=50") == (
        train,
        val,
    )
    assert held_out_split(items, SimpleNamespace(train_size=200, val_size=10, seed=4), what="n=50") != (
        train,
        val,
    )


def test_nothing_left_to_train_on_is_refused() -> None:
    with pytest.raises(
        RlzooError, match=r"val_size=5 leaves nothing to train on: only 5 distinct items with lo=1, hi=2"
    ):
        held_out_split([1, 2, 3, 4, 5], SimpleNamespace(train_size=8, val_size=5, seed=0), what="lo=1, hi=2")
