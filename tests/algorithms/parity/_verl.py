"""verl 0.9.1's own functions for the parity suite, and the randomised inputs both sides get.

verl is a test-only extra: ``pip install -c constraints.txt --no-deps verl==0.9.1`` then
``pip install -c constraints.txt tensordict codetiming orjson``. Without it every parity test is
skipped with that reason (importing this module raises pytest's Skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

VERL_VERSION = "0.9.1"
_HOW = (
    f"verl {VERL_VERSION} is a test-only extra: pip install -c constraints.txt --no-deps verl=={VERL_VERSION} "
    "&& pip install -c constraints.txt tensordict codetiming orjson"
)

verl = pytest.importorskip("verl", reason=f"verl is not importable; {_HOW}", exc_type=ImportError)
if getattr(verl, "__version__", None) != VERL_VERSION:
    pytest.skip(
        f"parity is pinned to verl {VERL_VERSION}, found {verl.__version__}; {_HOW}", allow_module_level=True
    )
core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason=f"verl's core_algos does not import; {_HOW}", exc_type=ImportError
)
rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason=_HOW, exc_type=ImportError)
verl_F = pytest.importorskip("verl.utils.torch_functional", reason=_HOW, exc_type=ImportError)

DT = torch.float64
#: the group layouts every estimator runs on: singletons, groups of 4, one group of 16
GROUP_SIZES = (1, 1, 4, 4, 4, 16)


@dataclass
class Batch:
    """One randomised batch: ragged right padding, masked spans inside some responses."""

    rewards: torch.Tensor  # [B, T] outcome reward on the last valid token
    mask: torch.Tensor  # [B, T] float64
    group_ids: torch.Tensor  # [B] long
    index: np.ndarray  # [B] verl's uid array
    values: torch.Tensor  # [B, T]
    log_probs: torch.Tensor  # [B, T] current policy
    old_log_probs: torch.Tensor  # [B, T]
    rollout_log_probs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B, T]
    is_weights: torch.Tensor  # [B, T]
    sum_pi_squared: torch.Tensor  # [B, T]


def make_batch(seed: int, group_sizes=GROUP_SIZES, T: int = 12, spans: bool = True) -> Batch:
    g = torch.Generator().manual_seed(seed)
    B = sum(group_sizes)
    ids = torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes))
    ids = ids[torch.randperm(B, generator=g)]  # groups interleaved
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # one full-length response
    pos = torch.arange(T)
    mask = (pos.unsqueeze(0) < lengths.unsqueeze(1)).to(DT)  # [B, T]
    if spans:  # a masked span (tool observation) strictly inside some responses
        for b in range(B):
            n = int(lengths[b])
            if n >= 5 and torch.rand((), generator=g) < 0.5:
                a = int(torch.randint(1, n - 3, (), generator=g))
                mask[b, a : a + 2] = 0.0
    last = (mask * pos).argmax(-1)  # [B] last valid position
    score = torch.randn(B, generator=g, dtype=DT)
    score[ids == ids[0]] = 0.5  # one group (maybe a singleton) with all-equal rewards
    rewards = torch.zeros(B, T, dtype=DT)
    rewards[torch.arange(B), last] = score
    old = -torch.rand(B, T, generator=g, dtype=DT) * 3 - 0.01
    lp = old + torch.randn(B, T, generator=g, dtype=DT) * 0.3
    roll = old + torch.randn(B, T, generator=g, dtype=DT) * 0.2
    probs = torch.rand(B, T, 5, generator=g, dtype=DT).softmax(-1)
    return Batch(
        rewards=rewards,
        mask=mask,
        group_ids=ids,
        index=np.array([f"uid{int(i)}" for i in ids], dtype=object),
        values=torch.randn(B, T, generator=g, dtype=DT),
        log_probs=lp,
        old_log_probs=old,
        rollout_log_probs=roll,
        advantages=torch.randn(B, T, generator=g, dtype=DT),
        is_weights=torch.rand(B, T, generator=g, dtype=DT) * 2,
        sum_pi_squared=probs.square().sum(-1),
    )


class Recorder:
    """Collects the largest |rlzoo - verl| per (part, quantity) for the coverage table."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], float] = {}

    def close(self, part: str, quantity: str, ours, theirs, atol: float = 1e-8, rtol: float = 1e-7) -> None:
        a = torch.as_tensor(ours, dtype=DT)
        b = torch.as_tensor(theirs, dtype=DT)
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        key = (part, quantity)
        self.rows[key] = max(self.rows.get(key, 0.0), diff)
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"{part} {quantity}: {m}")


RECORD = Recorder()
