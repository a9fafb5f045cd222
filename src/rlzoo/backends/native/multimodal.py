"""Vision-language (Qwen2-VL / Qwen2.5-VL style) inputs for the native rollout engine and trainer.

A VL prompt differs from a text prompt in three ways, and this module holds one function for each:

1. **Image tokens.** The chat template renders each image as ``<|vision_start|><|image_pad|>
   <|vision_end|>``; the processor expands the single ``<|image_pad|>`` into one per merged patch
   (``grid_t * grid_h * grid_w / merge_size**2``) and returns ``pixel_values`` ``[patches, C*P*P*Tp]``
   and ``image_grid_thw`` ``[images, 3]``. :func:`expand_prompt` does this for one request.
2. **Multimodal rotary positions (M-RoPE).** Position ids are ``[3, B, L]`` (temporal, height,
   width); text tokens share one position on all three axes, image tokens get their patch's
   (t, h, w). They come from the model's own ``get_rope_index`` (:func:`rope_position_ids`), which
   also returns ``rope_deltas`` ``[B, 1]``: after the prompt, token ``k`` (0-based position in the
   unpadded sequence) has position ``k + rope_deltas`` on all three axes
   (:func:`decode_position_ids`), so decoding never needs the images again.
3. **Pixel inputs in the forward.** The prefill (rollout) and every training forward pass
   ``pixel_values`` and ``image_grid_thw`` of the rows' images, concatenated in row order
   (:func:`collate_images`); decode steps pass none (the KV cache holds them).

:func:`vl_token_log_probs` is the trainer's forward for a VL micro-batch in rlzoo's batch layout
(left-padded prompt + right-padded response), giving the same log-probs as the rollout (and the
entropy when asked).

Loading and prompt expansion are data-side and model-agnostic; they live in
:mod:`rlzoo.models.processor` (re-exported here): :func:`has_vision_config` tells a VL model folder
(load it with ``AutoModelForImageTextToText``), :func:`load_processor` its processor.

Works with transformers 4.5x (``get_rope_index(input_ids, image_grid_thw, video_grid_thw,
attention_mask)``) and 5.x (which also takes ``mm_token_type_ids``). Nothing here is imported
unless a VL model is used.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.kernel.batch import Batch
from rlzoo.train_kit.logprobs import DEFAULT_LOG_PROB_CHUNK, pad_response, token_log_probs, trim

__all__ = [
    "collate_images",
    "decode_position_ids",
    "is_multimodal_model",
    "mm_token_type_ids",
    "rope_position_ids",
    "vl_actor_log_probs",
    "vl_forward_inputs",
    "vl_token_log_probs",
]


def is_multimodal_model(model: nn.Module) -> bool:
    """Whether ``model`` takes images through M-RoPE (has a ``get_rope_index``)."""
    return _rope_index_fn(model) is not None


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The vision encoder of a Qwen2-VL-style model (``visual``, on the model or its inner ``model``)."""
    for owner in (model, getattr(model, "model", None)):
        tower = getattr(owner, "visual", None)
        if isinstance(tower, nn.Module):
            return tower
    return None


def _rope_index_fn(model: nn.Module) -> Any:
    for owner in (model, getattr(model, "model", None)):
        fn = getattr(owner, "get_rope_index", None)
        if callable(fn):
            return fn
    return None


def _config(model: nn.Module) -> Any:
    return model.config


def mm_token_type_ids(input_ids: Tensor, config: Any) -> Tensor:
    """``[B, L]`` int: 1 on image tokens, 2 on video tokens, 0 elsewhere (transformers 5's convention)."""
    image_id = getattr(config, "image_token_id", None)
    video_id = getattr(config, "video_token_id", None)
    out = torch.zeros_like(input_ids, dtype=torch.int)  # [B, L]
    if image_id is not None:
        out = out.masked_fill(input_ids == image_id, 1)
    if video_id is not None:
        out = out.masked_fill(input_ids == video_id, 2)
    return out


def rope_position_ids(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, image_grid_thw: Tensor | None
) -> tuple[Tensor, Tensor]:
    """M-RoPE position ids ``[3, B, L]`` and ``rope_deltas`` ``[B, 1]`` of left- or right-padded rows.

    ``image_grid_thw`` ``[I, 3]`` lists the images of all rows in row order (None: text only).
    Padding columns get position 1 (the model's convention); they are masked out anyway.
    """
    fn = _rope_index_fn(model)
    if fn is None:
        raise TypeError(f"{type(model).__name__} has no get_rope_index: not a Qwen2-VL-style model")
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {
        "image_grid_thw": image_grid_thw,
        "video_grid_thw": None,
        "attention_mask": attention_mask,
    }
    if "mm_token_type_ids" in params:
        kw["mm_token_type_ids"] = mm_token_type_ids(input_ids, _config(model))
    pos, deltas = fn(input_ids, **kw)  # [3, B, L], [B, 1]
    return pos, deltas


def decode_position_ids(rope_deltas: Tensor, positions: Tensor) -> Tensor:
    """Position ids ``[3, B, K]`` of generated tokens.

    ``positions`` ``[B, K]`` is each token's index in its row's unpadded sequence (what the native
    engine keeps as ``pos``, 0-based); the M-RoPE position is ``positions + rope_deltas`` on all three
    axes.
    """
    text = positions + rope_deltas.to(positions.device)  # [B, K]
    return text.unsqueeze(0).expand(3, -1, -1)  # [3, B, K]


def collate_images(
    items: Sequence[Mapping[str, Any] | None], device: torch.device | str | None = None
) -> dict[str, Tensor]:
    """Concatenate the ``pixel_values`` / ``image_grid_thw`` of rows (None or {} for text rows).

    The model assigns image features to image tokens in order, so the rows' images must be
    concatenated in the same row order as the batch. Returns {} when no row has an image. Other
    keys of the rows (e.g. the PIL ``images`` a request also carries) are ignored. ``device``:
    where the outputs go (default: where the rows' tensors are).
    """
    pixels = [m["pixel_values"] for m in items if m and "pixel_values" in m]
    grids = [m["image_grid_thw"] for m in items if m and "image_grid_thw" in m]
    if not pixels:
        return {}
    out = {"pixel_values": torch.cat(pixels, 0), "image_grid_thw": torch.cat(grids, 0)}
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out


def vl_forward_inputs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, images: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """What a full (prefill / training) forward of a VL model takes beyond ids and mask.

    Returns M-RoPE ``position_ids`` ``[3, B, L]``, ``rope_deltas`` ``[B, 1]`` and the keyword
    arguments ``pixel_values`` / ``image_grid_thw`` (when ``images`` has any) and
    ``mm_token_type_ids`` (when the model's forward takes it).
    """
    grid = images.get("image_grid_thw")
    pos, deltas = rope_position_ids(model, input_ids, attention_mask, grid)  # [3, B, L], [B, 1]
    kw: dict[str, Any] = {}
    if "pixel_values" in images:
        kw["pixel_values"] = images["pixel_values"]
        kw["image_grid_thw"] = grid
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        kw["mm_token_type_ids"] = mm_token_type_ids(input_ids, _config(model))
    return pos, deltas, kw


def vl_token_log_probs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    responses: Tensor,
    images: Mapping[str, Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs ``[B, T]`` of ``responses`` under a VL model, in rlzoo's batch layout, and the
    entropy ``[B, T]`` of the same distribution when ``with_entropy`` (else None).

    ``input_ids`` / ``attention_mask`` ``[B, P+T]`` (prompt left-padded to P, response right-padded
    to T, :mod:`rlzoo.kernel.batch`), ``responses`` ``[B, T]``, ``images`` from :func:`collate_images`.
    Position ``P - 1 + t`` predicts response token ``t``; ``log softmax(logits / temperature)`` in
    fp32 by :func:`rlzoo.train_kit.logprobs.token_log_probs` (chunks of ``chunk_tokens`` positions, as the
    text path); zero where the response is padding. Gradients flow (call under ``torch.no_grad()`` for old / ref log-probs).
    """
    T = responses.shape[1]
    valid = attention_mask[:, -T:].bool()  # [B, T]
    cfg = _config(model)
    for name in ("image_token_id", "video_token_id"):
        tid = getattr(cfg, name, None)
        if tid is not None and bool(((responses == tid) & valid).any()):
            raise ValueError(
                f"a response holds the {name.split('_')[0]} placeholder token {tid}: the model would take "
                "it for an image slot (the native engine never samples it; filter such samples)"
            )
    pos, _, kw = vl_forward_inputs(model, input_ids, attention_mask, images)  # [3, B, P+T]
    L = input_ids.shape[1]
    keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    if keep:  # only the response's logits go through the LM head, exactly [B, T, V]
        kw["logits_to_keep"] = torch.arange(L - T - 1, L - 1, device=input_ids.device)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False, **kw)
    logits = out.logits if keep else out.logits[:, -(T + 1) : -1]  # [B, T, V]
    lp, ent = token_log_probs(
        logits, responses, temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens
    )  # [B, T]
    lp = torch.where(valid, lp, torch.zeros_like(lp))  # [B, T]
    if ent is None:
        return lp, None
    return lp, torch.where(valid, ent, torch.zeros_like(ent))  # [B, T], [B, T]


def vl_actor_log_probs(
    module: nn.Module,
    mb: Batch,
    *,
    temperature: float,
    with_entropy: bool,
    vision_dtype: torch.dtype,
    chunk_tokens: int = DEFAULT_LOG_PROB_CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (+ entropy) ``[b, T]`` of one VL micro-batch already on the device; zero on padding.

    The rows' images (``mb["multi_modal"]``, concatenated in row order, pixels cast to
    ``vision_dtype``) go into the forward and positions are M-RoPE ones computed from the ids
    (``mb["position_ids"]`` is ignored); the text path is :func:`rlzoo.train_kit.logprobs.actor_log_probs`.
    """
    images = collate_images(mb.get("multi_modal") or [None] * len(mb), device=mb["input_ids"].device)
    if "pixel_values" in images:
        images["pixel_values"] = images["pixel_values"].to(vision_dtype)
    # columns no row attends to are cut as in the text path: M-RoPE positions only count
    # attended tokens, so the result is the same as over the untrimmed micro-batch
    ids, attn, _, t_eff, _ = trim(mb)
    lp, ent = vl_token_log_probs(
        module,
        ids,
        attn,
        mb["responses"][:, :t_eff],
        images,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )  # [b, T_eff]
    return pad_response(lp, mb), None if ent is None else pad_response(ent, mb)  # [b, T]
