"""The batch that travels between parts: tensors with a shared leading dimension + per-sample fields.

We considered ``tensordict`` (made for this) and chose a small container of our own: tensordict
ships compiled extensions pinned to torch releases, and everything we need is a dict of tensors
that is indexed, split and concatenated together with a few per-sample Python fields.

Layout of a training batch (``B`` samples, ``P`` prompt width, ``T`` response width)::

    input_ids       [B, P+T]  prompt left-padded to P, response right-padded to T
    attention_mask  [B, P+T]  1 on real tokens
    position_ids    [B, P+T]  cumsum(attention_mask) - 1, clamped at 0
    responses       [B, T]    = input_ids[:, P:]
    response_mask   [B, T]    1 on generated tokens
    group_ids       [B]       samples of the same prompt share an id
    rollout_log_probs, old_log_probs, ref_log_probs, values,
    token_level_scores, token_level_rewards, advantages, returns   [B, T]

Per-sample Python fields (``meta``): ``uid``, ``data_source``, ``ground_truth``, ``versions`` ...
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.meta.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {sizes}")

    # -- size and access ------------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for m in self.meta.values():
            return len(m)
        return 0

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.meta

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.meta:
            return self.meta[key]
        raise KeyError(
            f"batch has no field {key!r}; fields: {', '.join(sorted([*self.tensors, *self.meta]))}"
        )

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if len(self) and value.shape[0] != len(self):
                raise ValueError(f"field {key!r} has leading size {value.shape[0]}, batch has {len(self)}")
            self.tensors[key] = value
        else:
            value = list(value)
            if len(self) and len(value) != len(self):
                raise ValueError(f"field {key!r} has {len(value)} items, batch has {len(self)}")
            self.meta[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.meta.get(key, default)

    # -- slicing --------------------------------------------------------------------------------
    def select(self, index: slice | Sequence[int] | torch.Tensor) -> Batch:
        """Rows of the batch (a slice, a list of indices, or a bool / long tensor)."""
        if isinstance(index, slice):
            rows = list(range(len(self)))[index]
            tensors = {k: v[index] for k, v in self.tensors.items()}
        else:
            idx = torch.as_tensor(index)
            if idx.dtype == torch.bool:
                idx = idx.nonzero(as_tuple=True)[0]
            rows = idx.tolist()
            tensors = {k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()}
        meta = {k: [v[i] for i in rows] for k, v in self.meta.items()}
        return Batch(tensors, meta)

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of at most ``size`` rows."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` nearly equal consecutive chunks (some may be empty when len < n)."""
        b = len(self)
        bounds = [round(i * b / n) for i in range(n + 1)]
        return [self.select(slice(bounds[i], bounds[i + 1])) for i in range(n)]

    def __iter__(self) -> Iterator[str]:
        return iter([*self.tensors, *self.meta])

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        batches = [b for b in batches if len(b)]
        if not batches:
            return Batch()
        keys = set(batches[0].tensors)
        for b in batches[1:]:
            if set(b.tensors) != keys:
                raise ValueError(
                    f"cannot concat batches with different fields: {sorted(keys)} vs {sorted(b.tensors)}"
                )
        tensors = {k: _cat_padded([b.tensors[k] for b in batches]) for k in keys}
        meta = {k: [x for b in batches for x in b.meta.get(k, [None] * len(b))] for k in batches[0].meta}
        return Batch(tensors, meta)

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta))

    def pin_like(self, **tensors: torch.Tensor) -> Batch:
        """A copy with extra tensor fields."""
        out = Batch(dict(self.tensors), dict(self.meta))
        for k, v in tensors.items():
            out[k] = v
        return out

    def state(self) -> Mapping[str, Any]:
        return {"tensors": self.tensors, "meta": self.meta}


def _cat_padded(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0; right-pad dim 1 with zeros when widths differ."""
    if ts[0].dim() < 2 or len({t.shape[1:] for t in ts}) == 1:
        return torch.cat(list(ts), 0)
    width = max(t.shape[1] for t in ts)
    out = []
    for t in ts:
        pad = width - t.shape[1]
        if pad:
            t = torch.nn.functional.pad(t, (0, pad) if t.dim() == 2 else (0, 0) * (t.dim() - 2) + (0, pad))
        out.append(t)
    return torch.cat(out, 0)
