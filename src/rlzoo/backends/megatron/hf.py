"""HF side of :mod:`.train`: loading a HF checkpoint's tensors, and exporting the actor as full
HF-named tensors or a standard HF folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlzoo.backends.megatron.convert import mcore_to_hf, merge_tp, stage_layers
from rlzoo.train_kit import checkpoint as ckpt

if TYPE_CHECKING:
    from rlzoo.backends.megatron.train import MegatronTrainBackend


def _load_hf_state_dict(path: str) -> dict[str, Tensor]:
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


def stage_full(backend: MegatronTrainBackend, module: nn.Module) -> dict[str, Tensor]:
    """This PP stage's tensors, TP shards gathered (on every TP rank)."""
    import torch.distributed as dist

    group = backend.mpu.get_tensor_model_parallel_group()
    local = {k: v for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    shards: list[dict[str, Tensor]] = [{} for _ in range(backend.tp)]
    for name, t in local.items():
        parts = [torch.empty_like(t) for _ in range(backend.tp)]
        dist.all_gather(parts, t.contiguous(), group=group)
        for r in range(backend.tp):
            shards[r][name] = parts[r]
    return merge_tp(shards)


def export_tensors(backend: MegatronTrainBackend) -> dict[str, Tensor]:
    """Full HF-named tensors of the actor (vocab unpadded), on every rank. Collective (SPMD).

    Gathers TP shards per stage and broadcasts each PP stage's tensors to every stage, then
    converts with :func:`.convert.mcore_to_hf`. Memory: one full copy of the model on the GPU
    of every rank while it is iterated (TODO: stream layer by layer for very large models).
    """
    import torch.distributed as dist

    if backend.params.param_offload:
        backend._onload(backend.actor_ddp)
    try:
        mine = backend._stage_full(backend.actor)
        spans = stage_layers(backend.dims.num_layers, backend.pp)
        full: dict[str, Tensor] = {}
        for s in range(backend.pp):
            names = [sorted(mine)] if s == backend.pp_rank else [None]
            if backend.pp > 1:
                src = dist.get_global_rank(backend.mpu.get_pipeline_model_parallel_group(), s)
                dist.broadcast_object_list(
                    names, src=src, group=backend.mpu.get_pipeline_model_parallel_group()
                )
            for name in names[0] or []:
                t = mine[name] if s == backend.pp_rank else None
                if backend.pp > 1:
                    meta = [(tuple(t.shape), t.dtype) if t is not None else None]
                    dist.broadcast_object_list(
                        meta, src=src, group=backend.mpu.get_pipeline_model_parallel_group()
                    )
                    if t is None:
                        if meta[0] is None:
                            raise RuntimeError(f"export: pipeline stage {s} sent no shape for {name!r}")
                        t = torch.empty(meta[0][0], dtype=meta[0][1], device=backend.device)
                    dist.broadcast(t, src=src, group=backend.mpu.get_pipeline_model_parallel_group())
                if name.startswith("decoder.layers."):
                    rest = name[len("decoder.layers.") :]
                    local_idx, tail = rest.split(".", 1)
                    name = f"decoder.layers.{int(local_idx) + spans[s].start}.{tail}"
                full[name] = t  # type: ignore[assignment]
        hf = mcore_to_hf(full, backend.dims, layer_spec=backend.params.layer_spec)
        return {name: t.detach() for name, t in hf.items()}
    finally:
        if backend.params.param_offload:
            backend._offload(backend.actor_ddp)


def export_hf(backend: MegatronTrainBackend, path: str | Path) -> None:
    """Write the actor as a standard HF folder (``save_pretrained``: safetensors + config.json +
    the base model's tokenizer) to ``path``. Collective: every rank calls it, rank 0 writes.

    The tensors are :meth:`_export_hf`'s (TP / PP gathered, vocabulary padding dropped). Rank 0
    builds the base model's HF class from its config on the meta device and loads them with
    strict name and shape checks; tied embeddings are tied again, so ``lm_head.weight`` is
    written exactly when the base config unties it. A vision-language base keeps its vision
    tower from the base checkpoint (this backend trains the text decoder only). A failure on
    rank 0 is raised on every rank.
    """
    import torch.distributed as dist

    state = backend._export_hf()
    error: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            with ckpt.atomic_dir(Path(path), {"format": "hf"}) as tmp:
                hf_model(backend, state).save_pretrained(str(tmp))
                ckpt.save_tokenizer(None, backend.spec, tmp)
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


def hf_model(
    backend: MegatronTrainBackend, state: Mapping[str, Tensor]
) -> Any:  # a transformers PreTrainedModel
    """The base model's HF class holding ``state`` (full HF-named tensors of the text decoder)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlzoo.models.processor import has_vision_config

    trust = backend.spec.trust_remote_code
    cfg = AutoConfig.from_pretrained(backend.spec.model_path, trust_remote_code=trust)
    auto: Any = AutoModelForCausalLM
    vision = has_vision_config(backend.spec.model_path, trust)
    if vision:
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText
    with torch.device("meta"):
        model = auto.from_config(cfg, trust_remote_code=trust, dtype=backend.dtype)
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
            base = auto.from_pretrained(backend.spec.model_path, trust_remote_code=trust, dtype=backend.dtype)
            base_sd = base.state_dict()
            tensors.update({k: base_sd[k].detach().clone() for k in rest})
            del base, base_sd
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise RuntimeError(
            f"export_hf: the converted tensors do not match {type(model).__name__} of "
            f"{backend.spec.model_path}: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    model.load_state_dict(tensors, strict=True, assign=True)  # raises on a shape mismatch
    if backend.dims.tie_word_embeddings:
        model.tie_weights()
    meta = [n for n, p in model.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"export_hf: parameters left without weights: {meta[:8]}")
    return model
