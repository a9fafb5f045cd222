"""Model calls of the native engine (a part it holds): forwards, prefills and a VL model's pixel /
M-RoPE inputs.

See the "Vision-language models" section of :mod:`rlzoo.backends.native.engine`'s docstring.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlzoo.backends.native.routes import RouteRecorder, moe_gates

if TYPE_CHECKING:
    from rlzoo.kernel.protocols import GenerationRequest


class ModelCalls:
    """The engine's model calls: what the model's ``forward`` takes (mask, positions, a cache,
    ``logits_to_keep``), whether the KV cache is usable, and a VL model's extra inputs.

    ``use_cache`` turns False for good the first time the model returns a cache whose layers cannot
    be sliced per row (:meth:`cache_ok`); ``stats`` is the engine's counter dict (prefills counted here).
    With ``record_routes`` (a MoE model) every forward leaves its routers' top-k expert indices
    ``[B, L, layers, top_k]`` in ``routes`` (:class:`~rlzoo.backends.native.routes.RouteRecorder`).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        use_kv_cache: bool,
        stats: dict[str, int],
        record_routes: bool = False,
        kv_spare_columns: int | None = None,
    ) -> None:
        self.model = model
        self.stats = stats
        #: spare columns of the cache's layers (:mod:`rlzoo.backends.native.kv`; None: its default,
        #: 0: transformers' layers, which concatenate every step)
        self.kv_spare_columns = kv_spare_columns
        self.recorder: RouteRecorder | None = None
        self.routes: Tensor | None = None  # [B, L, layers, top_k] of the last forward (record_routes)
        if record_routes:
            gates = moe_gates(model)
            if not gates:
                raise ValueError(
                    f"record_routes: the model ({type(model).__name__}) has no MoE router (no '*.mlp.gate' "
                    "module with top_k / num_experts, as Qwen3-MoE / Qwen2-MoE have); router replay needs a "
                    "MoE model: set record_routes false for a dense one"
                )
            self.recorder = RouteRecorder(gates)
        first_param = next(iter(model.parameters()), None)
        self.device = first_param.device if first_param is not None else torch.device("cpu")
        sig = inspect.signature(model.forward).parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values())
        self.cache_kw = next((k for k in ("cache", "past_key_values") if k in sig), None)
        self.keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in sig), None)
        self.takes_mask = "attention_mask" in sig or var_kw
        self.takes_pos = "position_ids" in sig or var_kw
        self.use_cache = bool(use_kv_cache) and self.cache_kw is not None
        from rlzoo.backends.native.multimodal import is_multimodal_model

        self.vl = is_multimodal_model(model)  # images + M-RoPE positions (engine docstring)

    def forward(
        self,
        ids: Tensor,
        mask: Tensor,
        pos: Tensor,
        cache: Any,
        want_cache: bool,
        extra: dict[str, Any] | None = None,
    ) -> tuple[Tensor, Any]:
        """Last-position logits [B, V] (float32) and the cache (None when unusable).

        ``extra``: more keyword arguments of the model (a VL model's pixel inputs).
        """
        kw: dict[str, Any] = {"input_ids": ids, **(extra or {})}
        if self.takes_mask:
            kw["attention_mask"] = mask
        if self.takes_pos:
            kw["position_ids"] = pos
        if self.cache_kw is not None:
            kw["use_cache"] = want_cache
            if want_cache and cache is not None:
                kw[self.cache_kw] = cache
        if self.keep_kw is not None:
            kw[self.keep_kw] = 1
        out = self.model(**kw)
        if self.recorder is not None:
            self.routes = self.recorder.take(ids.shape[0], ids.shape[1])  # [B, L, layers, top_k]
        if isinstance(out, Tensor):
            logits, new_cache = out, None
        elif isinstance(out, tuple):
            logits, new_cache = out[0], None
        else:
            logits = out.logits
            new_cache = getattr(out, "cache", None)
            if new_cache is None:
                new_cache = getattr(out, "past_key_values", None)
        if want_cache and not self.cache_ok(new_cache):
            self.use_cache = False  # e.g. sliding-window / linear-attention layers: recompute from now on
            new_cache = None
        if want_cache and new_cache is not None and self.kv_spare_columns != 0:
            from rlzoo.backends.native.kv import with_spare_columns

            with_spare_columns(new_cache, self.kv_spare_columns)  # decode steps write in place
        logits = logits[:, -1].float()  # [B, V]
        return logits, (new_cache if want_cache else None)

    @staticmethod
    def cache_ok(cache: Any) -> bool:
        """Whether the cache is one whose layers we can slice and concatenate per row/column."""
        from transformers.cache_utils import DynamicCache, DynamicLayer

        from rlzoo.backends.native.kv import SpareLayer

        if not isinstance(cache, DynamicCache) or not hasattr(cache, "layers"):
            return False
        return all(type(layer) in (DynamicLayer, SpareLayer) for layer in cache.layers)

    def prefill(
        self, ctx_ids: Tensor, ctx_mask: Tensor, images: list[dict[str, Any] | None] | None = None
    ) -> tuple[Any, Tensor | None]:
        """The KV cache of left-padded contexts [b, P] (None if P == 0 or no cache is used) and,
        for a VL model, the rows' M-RoPE ``rope_delta`` [b] (``images``: each row's pixel inputs)."""
        deltas, pos, extra = None, None, None
        if self.vl and ctx_ids.shape[1] > 0:
            pos, deltas, extra = self.vl_inputs(ctx_ids, ctx_mask, images or [None] * len(ctx_ids))
        if ctx_ids.shape[1] == 0 or not self.use_cache:
            return None, deltas
        if pos is None:
            pos = (ctx_mask.cumsum(-1) - 1).clamp(min=0)  # [b, P]
        self.stats["prefill_forwards"] += 1
        _, cache = self.forward(ctx_ids, ctx_mask, pos, None, want_cache=True, extra=extra)
        return cache, deltas

    def vl_inputs(
        self, ids: Tensor, mask: Tensor, images: list[dict[str, Any] | None]
    ) -> tuple[Tensor, Tensor, dict[str, Any]]:
        """M-RoPE positions [3, b, L], ``rope_delta`` [b] and the pixel keyword arguments of a full
        forward over the rows ``ids`` / ``mask`` [b, L], whose images are ``images`` (row order)."""
        from rlzoo.backends.native.multimodal import collate_images, vl_forward_inputs

        pixels = collate_images(images, device=self.device)
        pos, deltas, extra = vl_forward_inputs(self.model, ids, mask, pixels)  # [3, b, L], [b, 1]
        return pos, deltas.reshape(-1).to(device=self.device, dtype=torch.long), extra

    @staticmethod
    def images(request: GenerationRequest) -> dict[str, Any] | None:
        """The pixel inputs of a request's prompt (None: text only)."""
        mm = request.multi_modal
        return mm if mm and "pixel_values" in mm else None
