"""Padding-free attention that costs what the sequences cost, on any device.

A padding-free forward (:func:`rlzoo.train_kit.logprobs.pack`) lays a micro-batch's sequences end
to end in one row whose position ids restart at 0 for each sequence. transformers' ``sdpa``
attention finds the sequences from those positions and builds one ``[N, N]`` mask over the whole
row: sdpa then computes every ``N x N`` score and masks all but the block-diagonal ones. For 16
answers of 300 tokens that is 16 times the attention the sequences need; measured on 2 CPU
cores (SmolLM2-135M, fp32, forward + backward) 85 s against 23 s for the same tokens padded.

The implementation registered here (:data:`PACKED_SDPA`) is sdpa everywhere except on a packed
row: there it runs sdpa's causal kernel on each sequence in turn (no mask, the sum of the
squares of the lengths instead of the square of their sum) and builds no ``[N, N]`` mask.
Padded forwards of the same model (a teacher divergence, a vision batch) get sdpa unchanged.

It also lets the samples of a group share their prompt: GRPO's ``n`` answers to one prompt are
packed as the prompt once, then each answer (:func:`rlzoo.train_kit.logprobs.pack` with
``share_prompts``), and each answer attends to the one copy of the prompt. The prompt's forward
and backward run once instead of ``n`` times (its gradient is the sum over the answers, as when
each answer had its own copy); at 8 answers of ~16 tokens to a ~45-token prompt that is a third of
the tokens.

- :func:`install` switches a model to it (text models of the listed types, attention ``sdpa``,
  no sliding window; anything else keeps its own attention, and says so).
- :func:`packed_forward` wraps a forward over a packed row: inside it, the mask builder returns
  no mask. The sequences come from the position ids each attention layer receives, so a layer
  recomputed in the backward (activation checkpointing) finds the same sequences.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "PACKED_ATTENTION_MODEL_TYPES",
    "PACKED_SDPA",
    "Segment",
    "install",
    "packed_forward",
    "row_layout",
    "shares_prompts",
]

logger = logging.getLogger("rlzoo")

#: the implementation's name in transformers' ``AttentionInterface`` / ``AttentionMaskInterface``
PACKED_SDPA = "rlzoo_packed_sdpa"

PACKED_ATTENTION_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})
"""HF model types whose attention layers are plain causal sdpa and receive the position ids (so a
packed row's sequences can be found in each layer)."""

_packed_row: contextvars.ContextVar[bool] = contextvars.ContextVar("rlzoo_packed_row", default=False)


@contextmanager
def packed_forward() -> Iterator[None]:
    """The forwards inside run on packed rows: the mask builder of :data:`PACKED_SDPA` builds none."""
    token = _packed_row.set(True)
    try:
        yield
    finally:
        _packed_row.reset(token)


@dataclass(frozen=True)
class Segment:
    """One run of a packed row: tokens ``[start, end)``, and the ``prefix`` tokens before them that
    they attend to (``[prefix_start, prefix_start + prefix_len)``: the prompt they share with the
    first segment of their group; ``prefix_len`` 0 for a segment that starts its own sequence)."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_len: int = 0


def row_layout(position_ids: Tensor | None) -> list[Segment] | None:
    """The segments of one packed row (``position_ids`` ``[1, N]``), or None when it is not a row of
    more than one segment.

    A segment starts wherever the position does not follow the one before. One that starts at
    position 0 starts a sequence (and a group); one that starts at ``p > 0`` continues the first
    ``p`` tokens of its group (positions ``0 .. p - 1``, its shared prompt;
    :func:`rlzoo.train_kit.logprobs.pack` with ``share_prompts``)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    pos = position_ids[0]
    n = int(pos.shape[0])
    breaks = ((pos[1:] - pos[:-1]) != 1).nonzero().flatten().add(1).tolist()
    if not breaks:
        return None
    starts = [0, *breaks]
    first = [int(v) for v in pos[starts].tolist()]
    if first[0] != 0:
        raise RuntimeError(f"{PACKED_SDPA}: a packed row must start at position 0, not {first[0]}")
    out: list[Segment] = []
    group_start = 0
    for s, e, p in zip(starts, [*starts[1:], n], first, strict=True):
        if p == 0:
            group_start = s
            out.append(Segment(s, e))
        else:
            if group_start + p > s:
                raise RuntimeError(
                    f"{PACKED_SDPA}: the segment at {s} continues position {p} of a group that has only "
                    f"{s - group_start} tokens before it"
                )
            out.append(Segment(s, e, group_start, p))
    return out


def packed_sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The ``AttentionInterface`` function: ``query`` ``[b, H, N, d]``, ``key`` / ``value``
    ``[b, H_kv, N, d]`` -> ``[b, N, H, d]``. On a packed row (no mask, one row, positions
    restarting): sdpa on each segment (:func:`row_layout`: causal within it, after its shared
    prompt); otherwise transformers' sdpa as it is."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    if _packed_row.get() and position_ids is None:
        raise RuntimeError(
            f"{PACKED_SDPA}: {type(module).__name__} got no position_ids, so the sequences of a packed row "
            "cannot be found; set trainer.backend.use_remove_padding=false for this model"
        )
    layout = None
    if attention_mask is None and query.shape[2] == key.shape[2]:
        layout = row_layout(position_ids)
    if layout is None:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return out, None
    kwargs.pop("is_causal", None)
    outs = []
    for seg in layout:
        q = query[:, :, seg.start : seg.end]
        k, v = key[:, :, seg.start : seg.end], value[:, :, seg.start : seg.end]
        if not seg.prefix_len:
            outs.append(sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0])
            continue
        prefix = slice(seg.prefix_start, seg.prefix_start + seg.prefix_len)
        k = torch.cat([key[:, :, prefix], k], dim=2)  # [1, H_kv, p + n, d]
        v = torch.cat([value[:, :, prefix], v], dim=2)
        n = seg.end - seg.start
        # token i of the segment (position p + i) sees the prompt and its segment up to itself
        allowed = torch.ones((n, seg.prefix_len + n), dtype=torch.bool, device=q.device).tril_(seg.prefix_len)
        outs.append(
            sdpa_attention_forward(module, q, k, v, allowed[None, None], is_causal=False, **kwargs)[0]
        )
    return torch.cat(outs, dim=1), None  # [1, N, H, d]


def shares_prompts(module: nn.Module) -> bool:
    """Whether ``module``'s packed rows may share prompts: the HF model in it (``module`` itself, or
    the first submodule with a config: a critic's backbone, a LoRA wrapper's base) attends with
    :data:`PACKED_SDPA` (transformers' own would read a shared row as separate sequences)."""
    for m in module.modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            return bool(config._attn_implementation == PACKED_SDPA)
    return False


def _mask(*args: Any, **kwargs: Any) -> Any:
    """The mask builder: none on a packed row (:func:`packed_forward`), else sdpa's."""
    from transformers.masking_utils import sdpa_mask

    if _packed_row.get():
        return None
    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, _mask)


def install(model: nn.Module, *, what: str = "model") -> bool:
    """Switch ``model`` (an HF model) to :data:`PACKED_SDPA` when that is exact for it: a text model
    of :data:`PACKED_ATTENTION_MODEL_TYPES` on ``sdpa`` with no sliding-window layers. Returns
    whether it did; a model left as it was is logged once (its packed forwards stay correct, at
    the ``[N, N]`` cost)."""
    config: Any = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == PACKED_SDPA:
        return True
    model_type = getattr(config, "model_type", None)
    layer_types = getattr(config, "layer_types", None) or []
    why = None
    if model_type not in PACKED_ATTENTION_MODEL_TYPES:
        why = f"model type {model_type!r} is not one of {sorted(PACKED_ATTENTION_MODEL_TYPES)}"
    elif impl != "sdpa":
        why = f"attn_implementation is {impl!r}, not sdpa"
    elif getattr(config, "sliding_window", None) or any(t != "full_attention" for t in layer_types):
        why = "it has sliding-window layers"
    if why is not None:
        logger.info("padding-free forwards of the %s keep transformers' %s attention: %s", what, impl, why)
        return False
    _register()
    model.set_attn_implementation(PACKED_SDPA)  # type: ignore[operator]
    return True
