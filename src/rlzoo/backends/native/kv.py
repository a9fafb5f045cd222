"""The native engine's KV cache layer: a decode step writes its column in place.

transformers' :class:`~transformers.cache_utils.DynamicLayer` appends a step's keys and values with
``torch.cat``: every decode step copies the whole cache of every layer. For a batch of 64 SmolLM2
answers growing to 300 tokens that is ~0.9 GB copied a step (30 layers, keys and values), and it
grows with the length. Without that copy the engine decoded 64 x 256 tokens 1.14x and 16 x 768
tokens 1.13x as fast on a 2-core AVX2 CPU (``benchmarks/kv_cache.py``, docs/performance.md).

:class:`SpareLayer` keeps its ``keys`` / ``values`` as the first columns of buffers with
:data:`SPARE_COLUMNS` columns to spare: ``update`` writes the new columns after them and returns the
longer views, so a step copies only its own column; the buffers grow (one copy) when the spare runs
out. The engine's batch surgery (:mod:`rlzoo.backends.native.batch`: rows dropped, joined, leading
columns cut) still assigns plain tensors to ``keys`` / ``values``; the next ``update`` sees that
they are no longer views of its buffers and copies them into new ones. Attention reads the views:
the same values at the same positions, so the logits equal ``DynamicLayer``'s bit for bit.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers.cache_utils import DynamicLayer

__all__ = ["SPARE_COLUMNS", "SpareLayer", "with_spare_columns"]

#: columns a layer's buffers hold beyond its length when they are (re)allocated: the buffers are
#: copied once per this many decode steps instead of every step
SPARE_COLUMNS = 64


def _is_prefix_view(view: Tensor, buf: Tensor) -> bool:
    """Whether ``view`` is ``buf[:, :, :n]`` for some ``n``."""
    return (
        view.data_ptr() == buf.data_ptr()
        and view.shape[:2] == buf.shape[:2]
        and view.shape[3] == buf.shape[3]
        and view.stride() == buf.stride()
    )


class SpareLayer(DynamicLayer):
    """A :class:`DynamicLayer` whose keys / values ``[B, H, n, D]`` are views of buffers
    ``[B, H, n + spare, D]``; see the module docstring."""

    def __init__(self, spare: int | None = None) -> None:
        super().__init__()
        self.spare = max(1, int(SPARE_COLUMNS if spare is None else spare))
        self._kbuf: Tensor | None = None
        self._vbuf: Tensor | None = None

    @classmethod
    def of(cls, layer: DynamicLayer, spare: int | None = None) -> SpareLayer:
        """This kind of layer holding ``layer``'s keys and values (not copied until the next update)."""
        new = cls(spare)
        vars(new).update(vars(layer))  # keys, values, is_initialized, device
        return new

    def _owned(self) -> bool:
        k, v, kb, vb = self.keys, self.values, self._kbuf, self._vbuf
        if k is None or v is None or kb is None or vb is None:  # no buffers yet
            return False
        return _is_prefix_view(k, kb) and _is_prefix_view(v, vb)

    def _adopt(self, need: int) -> None:
        """New buffers holding the current keys / values and room for ``need`` columns in all."""
        k, v = self.keys, self.values
        assert k is not None and v is not None
        n = k.shape[2]
        kb = k.new_empty(k.shape[0], k.shape[1], need + self.spare, k.shape[3])
        vb = v.new_empty(v.shape[0], v.shape[1], need + self.spare, v.shape[3])
        kb[:, :, :n] = k
        vb[:, :, :n] = v
        self._kbuf, self._vbuf = kb, vb
        self.keys, self.values = kb[:, :, :n], vb[:, :, :n]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)  # the first columns
        n, q = self.keys.shape[2], key_states.shape[2]
        if (
            key_states.shape[0] != self.keys.shape[0]
            or key_states.dtype != self.keys.dtype
            or value_states.dtype != self.values.dtype  # type: ignore[union-attr]
        ):
            return super().update(key_states, value_states, *args, **kwargs)  # let torch.cat say why
        if not self._owned() or n + q > self._kbuf.shape[2]:  # type: ignore[union-attr]
            self._adopt(n + q)
        kb, vb = self._kbuf, self._vbuf
        assert kb is not None and vb is not None
        kb[:, :, n : n + q] = key_states
        vb[:, :, n : n + q] = value_states
        self.keys, self.values = kb[:, :, : n + q], vb[:, :, : n + q]
        return self.keys, self.values

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


def with_spare_columns(cache: Any, spare: int | None = None) -> Any:
    """``cache`` (a ``DynamicCache`` of plain full-attention layers) with each layer a
    :class:`SpareLayer` of ``spare`` spare columns (None: :data:`SPARE_COLUMNS`), in place; returned
    for chaining."""
    cache.layers = [
        layer if isinstance(layer, SpareLayer) else SpareLayer.of(layer, spare) for layer in cache.layers
    ]
    return cache
