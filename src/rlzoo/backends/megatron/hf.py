"""The HF side of the megatron train backend: loading a HF checkpoint's tensors, and exporting the
actor (its megatron modules on this rank, with the parallel layout) as full HF-named tensors or a
standard HF folder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlzoo.backends.megatron.convert import (
    ModelDims,
    is_expert,
    mcore_to_hf,
    merge_ep,
    merge_tp,
    stage_layers,
)
from rlzoo.backends.megatron.parallel import Layout
from rlzoo.kernel.settings import TrainSpec
from rlzoo.train_kit import checkpoint as ckpt

__all__ = ["export_hf", "export_tensors", "gather_ep", "gather_tp", "hf_model", "load_hf_state_dict"]


def load_hf_state_dict(path: str) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path!r}")
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(load_file(str(f), device="cpu"))
    # Qwen2.5-VL checkpoints (transformers >= 4.52): the text decoder lives under model.language_model.
    return {
        k.replace("model.language_model.", "model."): v
        for k, v in out.items()
        if not k.startswith("model.visual.")
    }


def gather_tp(module: nn.Module, tp: int, etp: int | None = None) -> dict[str, Tensor]:
    """This PP stage's tensors of ``module``, its TP shards gathered (on every TP rank): a routed
    expert's over its ``etp`` expert tensor-parallel ranks (default: ``tp``), the rest over ``tp``."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    etp = tp if etp is None else etp
    local = {k: v for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    merged: dict[str, Tensor] = {}
    for experts, size in ((False, tp), (True, etp)):
        group = mpu.get_expert_tensor_parallel_group() if experts else mpu.get_tensor_model_parallel_group()
        shards: list[dict[str, Tensor]] = [{} for _ in range(size)]
        for name, t in local.items():
            if is_expert(name) != experts:
                continue
            parts = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(parts, t.contiguous(), group=group)
            for r in range(size):
                shards[r][name] = parts[r]
        if shards[0]:
            merged.update(merge_tp(shards))
    return merged


def gather_ep(stage: Mapping[str, Tensor], ep: int, num_experts: int) -> dict[str, Tensor]:
    """This PP stage's tensors (TP gathered) with every EP rank's experts, in global expert numbers
    (on every EP rank); the other tensors are the same on every EP rank and kept as they are."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    if ep == 1:
        return dict(stage)
    group = mpu.get_expert_model_parallel_group()
    shards: list[dict[str, Tensor]] = [{} for _ in range(ep)]
    for name, t in stage.items():
        if not is_expert(name):
            shards[0][name] = t
            continue
        parts = [torch.empty_like(t) for _ in range(ep)]
        dist.all_gather(parts, t.contiguous(), group=group)
        for r in range(ep):
            shards[r][name] = parts[r]
    return merge_ep(shards, num_experts)


def export_tensors(
    actor: nn.Module, *, dims: ModelDims, layer_spec: str, layout: Layout, device: torch.device
) -> dict[str, Tensor]:
    """Full HF-named tensors of ``actor`` (this rank's megatron module; vocab unpadded), on every
    rank. Collective (SPMD); ``actor``'s weights must be on ``device``.

    Gathers TP shards per stage and broadcasts each PP stage's tensors to every stage, then
    converts with :func:`.convert.mcore_to_hf`. Memory: one full copy of the model on the GPU
    of every rank while it is iterated (TODO: stream layer by layer for very large models).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    pp, pp_rank = layout.pp, layout.pp_rank
    mine = gather_ep(gather_tp(actor, layout.tp, layout.etp), layout.ep, dims.num_experts)
    spans = stage_layers(dims.num_layers, pp)
    full: dict[str, Tensor] = {}
    for s in range(pp):
        names = [sorted(mine)] if s == pp_rank else [None]
        if pp > 1:
            src = dist.get_global_rank(mpu.get_pipeline_model_parallel_group(), s)
            dist.broadcast_object_list(names, src=src, group=mpu.get_pipeline_model_parallel_group())
        for name in names[0] or []:
            t = mine[name] if s == pp_rank else None
            if pp > 1:
                meta = [(tuple(t.shape), t.dtype) if t is not None else None]
                dist.broadcast_object_list(meta, src=src, group=mpu.get_pipeline_model_parallel_group())
                if t is None:
                    if meta[0] is None:
                        raise RuntimeError(f"export: pipeline stage {s} sent no shape for {name!r}")
                    t = torch.empty(meta[0][0], dtype=meta[0][1], device=device)
                dist.broadcast(t, src=src, group=mpu.get_pipeline_model_parallel_group())
            if name.startswith("decoder.layers."):
                rest = name[len("decoder.layers.") :]
                local_idx, tail = rest.split(".", 1)
                name = f"decoder.layers.{int(local_idx) + spans[s].start}.{tail}"
            full[name] = t  # type: ignore[assignment]
    hf = mcore_to_hf(full, dims, layer_spec=layer_spec)
    return {name: t.detach() for name, t in hf.items()}


def export_hf(
    path: str | Path,
    tensors: Callable[[], Mapping[str, Tensor]],
    spec: TrainSpec,
    *,
    dims: ModelDims,
    dtype: torch.dtype,
) -> None:
    """Write the actor as a standard HF folder (``save_pretrained``: safetensors + config.json +
    the base model's tokenizer) to ``path``. Collective: every rank calls it, rank 0 writes.

    ``tensors`` is called once on every rank for the actor's full HF-named tensors (the backend's
    :func:`export_tensors`: TP / PP gathered, vocabulary padding dropped); each rank drops them as
    soon as it is done with them. Rank 0 builds the base model's HF class (:func:`hf_model`) and
    saves it. A failure on rank 0 is raised on every rank.
    """
    import torch.distributed as dist

    state = tensors()
    error: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            with ckpt.atomic_dir(Path(path), {"format": "hf"}) as tmp:
                hf_model(state, spec, dims=dims, dtype=dtype).save_pretrained(str(tmp))
                ckpt.save_tokenizer(None, spec, tmp)
        except Exception as e:
            error[0] = f"{type(e).__name__}: {e}"
            raise
        finally:
            del state
            dist.broadcast_object_list(error, src=0)  # the other ranks wait here, and learn the outcome
    else:
        del state
        dist.broadcast_object_list(error, src=0)
        if error[0] is not None:
            raise RuntimeError(f"export_hf failed on rank 0: {error[0]}")


def hf_model(state: Mapping[str, Tensor], spec: TrainSpec, *, dims: ModelDims, dtype: torch.dtype) -> Any:
    """The HF class of the base model at ``spec.model_path`` (a transformers ``PreTrainedModel``,
    in ``dtype``) holding ``state`` (full HF-named tensors of the text decoder, ``dims``' model).

    The model is built from the base config on the meta device and loads ``state`` with strict
    name and shape checks; tied embeddings are tied again, so ``lm_head.weight`` is written
    exactly when the base config unties it. A vision-language base keeps its vision tower from
    the base checkpoint (the megatron backend trains the text decoder only)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlzoo.models.processor import has_vision_config

    trust = spec.trust_remote_code
    cfg = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=trust)
    auto: Any = AutoModelForCausalLM
    vision = has_vision_config(spec.model_path, trust)
    if vision:
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText
    with torch.device("meta"):
        model = auto.from_config(cfg, trust_remote_code=trust, dtype=dtype)
    expected = set(model.state_dict())
    copies: dict[int, Tensor] = {}  # on the CPU, owning their storage; a tied pair stays one tensor
    tensors: dict[str, Tensor] = {}
    for name, t in state.items():
        if name not in expected and name.startswith("model."):  # VL: the decoder is model.language_model
            name = "model.language_model." + name[len("model.") :]
        if id(t) not in copies:
            copies[id(t)] = t.detach().to("cpu", copy=True)
        tensors[name] = copies[id(t)]
    if vision:  # not trained here: the base checkpoint's vision tower
        rest = sorted(k for k in expected - set(tensors) if "visual." in k)
        if rest:
            base = auto.from_pretrained(spec.model_path, trust_remote_code=trust, dtype=dtype)
            base_sd = base.state_dict()
            tensors.update({k: base_sd[k].detach().clone() for k in rest})
            del base, base_sd
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise RuntimeError(
            f"export_hf: the converted tensors do not match {type(model).__name__} of "
            f"{spec.model_path}: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    model.load_state_dict(tensors, strict=True, assign=True)  # raises on a shape mismatch
    if dims.tie_word_embeddings:
        model.tie_weights()
    meta = [n for n, p in model.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"export_hf: parameters left without weights: {meta[:8]}")
    return model
