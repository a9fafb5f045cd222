"""Consecutive named items grouped into buckets of at most a byte budget: the unit of a weight push.

Torch-free (the sizes come from a function), so the trainer's broadcast
(:func:`rlzoo.distributed.weight_sync.iter_buckets`) and a rollout backend's own loading plan share
one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

K = TypeVar("K")
T = TypeVar("T")


def iter_bucketed(
    named: Iterable[tuple[K, T]], nbytes: Callable[[T], int], bucket_bytes: int, align: int = 16
) -> Iterator[list[tuple[K, T]]]:
    """Lists of consecutive ``(key, item)`` pairs whose sizes add up to at most ``bucket_bytes``.

    Each item's size, ``nbytes(item)``, is rounded up to ``align`` bytes (its offset in a flat
    bucket); an item larger than ``bucket_bytes`` forms a bucket of its own. Lazy: pulls one pair
    at a time.
    """
    cur: list[tuple[K, T]] = []
    used = 0
    for key, item in named:
        n = (int(nbytes(item)) + align - 1) // align * align
        if cur and used + n > bucket_bytes:
            yield cur
            cur, used = [], 0
        cur.append((key, item))
        used += n
    if cur:
        yield cur
