"""A module's train / eval mode around a forward that must not train (log-probs, values)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode (dropout off) inside the block; its previous mode back after it,
    also when the block raises."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
