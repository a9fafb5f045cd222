"""Sampling helpers of the native engine: per-sequence generator seeds and top-k / top-p filtering.

See the "Sampling" section of :mod:`rlzoo.backends.native.engine`'s docstring for the design.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

_NEG_INF = float("-inf")
_NO_TOP_K = 1 << 62  # top-k "off": larger than any vocabulary


def _mix_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (same parts, same seed, any process)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _filter_top_k_top_p(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Logits with everything outside each row's top-k, then top-p, set to -inf.

    ``scaled`` [B, V]; ``top_k`` [B] long (V where off); ``top_p`` [B] float (1.0 where off).
    """
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # [B, V]
    rank = torch.arange(scaled.shape[-1], device=scaled.device)  # [V]
    keep = rank[None, :] < top_k[:, None]  # [B, V]
    sorted_logits = sorted_logits.masked_fill(~keep, _NEG_INF)  # [B, V]
    probs = sorted_logits.softmax(dim=-1)  # [B, V], renormalised over the top-k
    mass_before = probs.cumsum(dim=-1) - probs  # [B, V], exclusive cumsum: the first token is always kept
    keep = keep & (mass_before < top_p[:, None])  # [B, V]
    sorted_logits = sorted_logits.masked_fill(~keep, _NEG_INF)  # [B, V]
    return torch.full_like(scaled, _NEG_INF).scatter(-1, order, sorted_logits)  # [B, V]
