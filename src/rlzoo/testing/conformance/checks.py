"""Tensor checks the conformance suites share: torch imported on first use, masks from lengths,
finiteness and closeness assertions, garbage for masked positions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def lazy_torch() -> Any:
    import torch

    return torch


def length_mask(lengths: Sequence[int], T: int) -> Tensor:
    torch = lazy_torch()
    return (torch.arange(T)[None, :] < torch.tensor(list(lengths))[:, None]).float()  # [B, T]


def assert_finite(x: Any, what: str) -> None:
    torch = lazy_torch()
    if isinstance(x, torch.Tensor):
        assert torch.isfinite(x).all(), f"{what} has NaN or inf: {x}"
    elif isinstance(x, (int, float)):
        assert math.isfinite(float(x)), f"{what} is not finite: {x}"


def assert_close(a: Tensor, b: Tensor, what: str, *, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    torch = lazy_torch()
    assert a.shape == b.shape, f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=False), f"{what}:\n{a}\nvs\n{b}"


def garbage(x: Tensor, seed: int, scale: float = 50.0) -> Tensor:
    """Large finite values shaped like ``x``, to be put where the mask is 0."""
    torch = lazy_torch()
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(x.shape, generator=g, dtype=x.dtype) * 2 - 1) * scale
